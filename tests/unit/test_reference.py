"""The checked-in reference pages are what ``tidemark.cli.reference`` renders from the code now, and the
rendering keeps what a reader needs: every field and every command, each page with its contents."""

from __future__ import annotations

import pytest

from tidemark.cli import reference
from tidemark.cli.main import build_parser
from tidemark.config import TidemarkConfig


@pytest.mark.parametrize("relative", sorted(reference.PAGES))
def test_the_checked_in_page_is_what_the_code_renders(relative: str) -> None:
    path = reference.ROOT / relative
    rendered = reference.PAGES[relative]()
    assert path.exists(), f"{relative} is missing: run `{reference.REGENERATE}` and commit it"
    assert path.read_text() == rendered, (
        f"{relative} is stale (its source changed since it was generated): run `{reference.REGENERATE}` "
        "and commit the result")


def test_every_field_of_every_section_is_in_the_configuration_page() -> None:
    page = reference.configuration_page()
    for model, paths in reference._sections(TidemarkConfig):
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in page, f"{paths[0]}.{name} is not on the page"
    assert "## Contents" in page
    # The YAML key is the alias, never the Python attribute behind it.
    assert "| `schema` |" in page and "schema_ddl" not in page


def test_every_command_is_in_the_commands_page_with_its_options() -> None:
    page = reference.commands_page()
    assert "## Contents" in page
    for parser, _help in reference._commands(build_parser()):
        assert f"- [`{parser.prog}`](#{reference._slug(parser.prog)})" in page
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page or f", {option}" in page, f"{parser.prog} {option}"


def test_a_field_docstring_is_read_from_the_source_when_pydantic_does_not_keep_it() -> None:
    from pydantic import BaseModel

    class Plain(BaseModel):  # no use_attribute_docstrings: pydantic leaves description empty
        retries: int = 3
        """How often a transient error is retried."""

    field = Plain.model_fields["retries"]
    assert field.description is None
    assert reference._description(Plain, "retries", field) == "How often a transient error is retried."


def test_cells_stay_one_line_and_keep_their_pipes_inside() -> None:
    assert reference._cell("a | b\nc\n\nnext paragraph") == r"a \| b c<br><br>next paragraph"


def test_usage_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = reference.commands_page()
    monkeypatch.setenv("COLUMNS", "300")
    assert reference.commands_page() == narrow


def test_check_mode_writes_nothing_and_names_the_stale_page(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    monkeypatch.setattr(reference, "PAGES", {"docs/reference/x.md": lambda: "x\n"})
    assert reference.main(["--check"]) == 1
    assert not (tmp_path / "docs/reference/x.md").exists()
    assert "stale docs/reference/x.md" in capsys.readouterr().out
    assert reference.main([]) == 0 and (tmp_path / "docs/reference/x.md").read_text() == "x\n"
    assert reference.main(["--check"]) == 0

