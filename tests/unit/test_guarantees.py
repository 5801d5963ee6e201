"""The guarantees cited across the repository resolve to docs/design.md's table, and the table
names modules and tests that exist: a citation a reader cannot look up, or a proof that was
renamed away, fails here rather than in a reader's hands."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
CITATION = re.compile(r"\bG[0-9]+\b")
# Not the project's own text: the virtualenv, git's store, tool caches and build output.
SKIPPED = {".venv", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", "__pycache__", "build", "dist",
           ".tidemark", "spark-warehouse"}
ROW = re.compile(r"^\|\s*(?:<a id=\"g[0-9]+\"></a>)?(G[0-9]+)\s*\|(.*)\|\s*$")


def _table() -> dict[str, list[str]]:
    """Each guarantee's id and its row's other cells, from the section the page opens with."""
    section = DESIGN.read_text().split("\n## The guarantees\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = ROW.match(line)
        if found:
            rows[found.group(1)] = [cell.strip() for cell in found.group(2).split(" | ")]
    return rows


def _project_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith((".py", ".md")):
                yield Path(folder, name)


def test_every_cited_guarantee_is_defined_in_the_design_table() -> None:
    defined = _table()
    assert defined, f"no guarantees table found under '## The guarantees' in {DESIGN}"
    undefined = [f"{path.relative_to(ROOT)}:{number}: {match}"
                 for path in _project_files()
                 for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 for match in CITATION.findall(line) if match not in defined]
    assert not undefined, ("guarantees cited but not defined in docs/design.md's table "
                           "(define them there or cite one that is):\n" + "\n".join(undefined))


def test_every_row_names_modules_and_tests_that_exist() -> None:
    missing = []
    for gid, (_guarantee, modules, tests) in _table().items():
        for path in re.findall(r"`([\w/]+(?:\.py|/))`", modules):
            if not (ROOT / path).exists():
                missing.append(f"{gid}: module {path}")
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tests)
        if not named:
            missing.append(f"{gid}: no test named")
        for path, function in named:
            file = ROOT / path
            defined = ({node.name for node in ast.walk(ast.parse(file.read_text()))
                        if isinstance(node, ast.FunctionDef)} if file.exists() else set())
            if function not in defined:
                missing.append(f"{gid}: test {path}::{function}")
    assert not missing, "docs/design.md's guarantees table names what does not exist:\n" + "\n".join(missing)


def test_the_table_defines_the_seven_guarantees_in_order() -> None:
    assert list(_table()) == [f"G{n}" for n in range(1, 8)]
