"""The reference pages, rendered from the code they describe, so they cannot drift from it.

``docs/reference/configuration.md`` comes from the models of ``tidemark/config.py`` (names,
types, defaults and each field's docstring) and ``docs/reference/commands.md`` from the
``tidemark`` parser. Both are checked in; ``tests/unit/test_reference.py`` fails when one
differs from what this module renders now. Regenerate them with::

    .venv/bin/python -m tidemark.cli.reference

This module reads the CLI's parser, so it lives on the CLI's floor (``tests/layers.py``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ByteSize, SecretStr
from pydantic.fields import FieldInfo

from tidemark.cli.main import build_parser
from tidemark.config import TidemarkConfig

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = ".venv/bin/python -m tidemark.cli.reference"
# Usage lines are wrapped at a fixed width, not the terminal's, so every machine renders the same page.
USAGE_WIDTH = 88

# ----------------------------------------------------------------------------- shared markdown


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _cell(text: str) -> str:
    """Text for one table cell: one line, paragraphs kept apart, no stray column breaks."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "<br><br>".join(p for p in paragraphs if p).replace("|", r"\|")


def _rst_to_markdown(text: str) -> str:
    """Docstrings are reStructuredText (``x``, :mod:`x`); the pages are Markdown."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _header(title: str, source: str) -> list[str]:
    return [f"# {title}", "",
            (f"Generated from {source} by `{REGENERATE}`; edit the source, not this page "
             "(a unit test fails while the page differs from what the command writes)."), ""]


# ----------------------------------------------------------------------------- configuration


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """Every model an annotation can hold, however deep in unions, lists and maps."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def _key(name: str, field: FieldInfo) -> str:
    return field.alias or name


def _sections(root: type[BaseModel]) -> list[tuple[type[BaseModel], list[str]]]:
    """Each model reachable from ``root`` once, in the order a reader meets it, with every
    YAML path it is found at (``pipelines[]`` is any item of the list)."""
    found: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        first = model not in found
        found.setdefault(model, []).append(path)
        if not first:
            return
        for name, field in model.model_fields.items():
            key = _key(name, field)
            for inner in _models(field.annotation):
                listed = typing.get_origin(field.annotation) is tuple
                visit(inner, f"{path}.{key}{'[]' if listed else ''}".lstrip("."))

    visit(root, "")
    return list(found.items())


def _constraint(meta: Any) -> list[str]:
    if isinstance(meta, FieldInfo):
        return [c for m in meta.metadata for c in _constraint(m)]
    words = []
    for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if getattr(meta, attr, None) is not None:
            words.append(f"{sign} {_value(getattr(meta, attr))}")
    if getattr(meta, "pattern", None) is not None:
        words.append(f"matching `{meta.pattern}`")
    return words


_NAMES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path",
                          SecretStr: "secret string", ByteSize: "byte size",
                          datetime: "ISO 8601 time with zone", type(None): "null"}


def _type(annotation: Any, titles: dict[type[BaseModel], str]) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        base, *meta = args
        limits = [c for m in meta for c in _constraint(m)]
        return _type(base, titles) + (f" ({', '.join(limits)})" if limits else "")
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a, titles) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{_value(a)}`" for a in args)
    if origin is tuple:
        item = _type(args[0], titles)
        return f"list of {item}s" if args[0] in _NAMES else f"list of {item.removeprefix('one of ')}"
    if origin is dict:
        return f"map of {_type(args[0], titles)} to {_type(args[1], titles)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[`{titles[annotation]}`](#{_slug(titles[annotation])})"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _value(value: Any) -> str:
    """A default as it would be written in ``tidemark.yaml``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, ByteSize):
        return value.human_readable().replace(".0", "")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its fields' defaults"
    text = _value(value)
    return f"`{text}`" if text else '`""`'


def _description(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    """The field's docstring. Pydantic keeps it only under ``use_attribute_docstrings``; a model
    without it still has the string literal after the field in its source, read here."""
    if field.description:
        return field.description
    return _attribute_docstrings(model).get(name, "")


def _attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(model))).body[0]
    assert isinstance(tree, ast.ClassDef)
    found: dict[str, str] = {}
    for node, after in zip(tree.body, tree.body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def configuration_page() -> str:
    sections = _sections(TidemarkConfig)
    titles = {model: paths[0] or "top level" for model, paths in sections}
    anchors = {model: _slug(title) for model, title in titles.items()}
    lines = _header("Configuration reference: `tidemark.yaml`", "the models of `tidemark/config.py`")
    lines += [("Commands read `./tidemark.yaml` unless given `--config PATH`. Every section rejects keys "
               "it does not define; a path like `pipelines[].dedup` is the `dedup` key of any item of the "
               "`pipelines` list. The environment settings of the stack itself (`TIDEMARK_*`) are in "
               "."), "", "## Contents", ""]
    lines += [f"- [`{titles[m]}`](#{anchors[m]})" if paths[0] else f"- [top level](#{anchors[m]})"
              for m, paths in sections]
    for model, paths in sections:
        lines += ["", f"## `{titles[model]}`" if paths[0] else "## top level", ""]
        if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
            lines += [_rst_to_markdown(inspect.cleandoc(model.__doc__)), ""]
        if len(paths) > 1:
            lines += ["The same fields at " + ", ".join(f"`{p}`" for p in paths[1:]) + ".", ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            kind = _type(field.annotation, titles)
            limits = [c for m in field.metadata for c in _constraint(m)]
            if limits:
                kind += f" ({', '.join(limits)})"
            meaning = _rst_to_markdown(_description(model, name, field))
            lines.append(f"| `{_key(name, field)}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- commands


def _commands(parser: argparse.ArgumentParser, help_text: str = "",
              ) -> Iterator[tuple[argparse.ArgumentParser, str]]:
    """The parser and every sub-command's, depth first, each with the help its parent gives it."""
    yield parser, help_text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _commands(sub, helps.get(name, ""))


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = _formatter(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        text = formatter._expand_help(action) if action.help else ""
        default = action.default
        shown = (default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0
                 and not isinstance(action, argparse._StoreConstAction))
        rows.append(f"| `{_cell(invocation)}` | {f'`{_cell(str(default))}`' if shown else ''} | {_cell(text)} |")
    return rows


def _subcommand_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                prog = f"{parser.prog} {choice.dest}"
                rows.append(f"| [`{choice.dest}`](#{_slug(prog)}) | {_cell(choice.help or '')} |")
    return rows


def commands_page() -> str:
    commands = list(_commands(build_parser()))
    lines = _header("Command reference: `tidemark`", "the parser of `tidemark/cli/main.py`")
    lines += [("Every command also takes `-h`/`--help`. Options of `tidemark` itself go before the command "
               "(`tidemark --debug ingest orders`)."), "", "## Contents", ""]
    for sub, _help in commands:
        depth = len(sub.prog.split()) - 1
        lines.append(f"{'  ' * max(depth - 1, 0)}- [`{sub.prog}`](#{_slug(sub.prog)})")
    for sub, help_text in commands:
        depth = len(sub.prog.split()) - 1
        lines += ["", f"{'#' * min(2 + max(depth - 1, 0), 6)} {sub.prog}", ""]
        about = sub.description or help_text
        if about:
            lines += [_cell(about[0].upper() + about[1:]) + ("" if about.endswith(".") else "."), ""]
        lines += ["```", _usage(sub), "```", ""]
        arguments = _argument_rows(sub)
        if arguments:
            lines += ["| argument | default | meaning |", "|---|---|---|", *arguments, ""]
        subcommands = _subcommand_rows(sub)
        if subcommands:
            lines += ["| command | what it does |", "|---|---|", *subcommands, ""]
        while lines[-1] == "":
            lines.pop()
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the pages

PAGES = {"docs/reference/configuration.md": configuration_page,
         "docs/reference/commands.md": commands_page}


def main(argv: list[str] | None = None) -> int:
    """Write every page; with ``--check``, write nothing and exit 1 if one is stale."""
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for relative, render in PAGES.items():
        path = ROOT / relative
        text = render()
        if path.exists() and path.read_text() == text:
            continue
        stale.append(relative)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for relative in stale:
        print(f"{'stale' if check else 'wrote'} {relative}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
