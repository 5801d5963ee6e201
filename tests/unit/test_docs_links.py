"""The docs a reader navigates hold together: every relative link in README.md and docs/ names a
file that exists and, with a ``#fragment``, a heading (or an HTML anchor) of that file, with
anchors computed as GitHub computes them; and no long page goes without a table of contents."""

from __future__ import annotations

import os
import re
import unicodedata
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
TOC_NEEDED_ABOVE = 400  # lines
TOC_WITHIN = 40         # first lines
TOC_MIN_LINKS = 3

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
# [text](target) and ![alt](target), the text allowing one level of brackets (`pipelines[]`),
# the target optionally in <...> and followed by a title.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _relative(path: Path, root: Path = ROOT) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    kept: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None:
            if opening:
                fence = opening.group(1)
                continue
            kept.append((number, line))
        elif opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence) \
                and not line.strip()[len(opening.group(1)):].strip():
            fence = None
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: the rendered text lowercased, punctuation other than
    ``-`` and ``_`` dropped, each space a ``-``."""
    parts = []
    for number, part in enumerate(CODE_SPAN.split(heading)):
        if number % 3 == 2:    # a code span's text, as it is (`<pipeline>` is text there)
            parts.append(part.strip())
        elif number % 3 == 0:  # outside code: a link stands for its text; HTML tags vanish
            part = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", part)
            parts.append(re.sub(r"<[^>]+>", "", part))
    text = "".join(parts).strip().lower()
    kept = "".join(c for c in text
                   if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside fenced code blocks, in order."""
    found = []
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchors_of(text: str) -> set[str]:
    """Every anchor a page offers: its headings' (a repeated one gets -1, -2, ... as on GitHub)
    and the ids and names of its HTML anchors."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, heading in headings(text):
        base = slug(heading)
        if base in seen:
            seen[base] += 1
            anchors.add(f"{base}-{seen[base]}")
        else:
            seen[base] = 0
            anchors.add(base)
    for _, line in prose_lines(text):
        anchors.update(HTML_ANCHOR.findall(line))
    return anchors


@cache
def _anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors_of(path.read_text(encoding="utf-8")))


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code blocks and code spans."""
    found = []
    for number, line in prose_lines(text):
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append((number, definition.group(1)))
            continue
        # A code span's text stays (a link's text may be code) but can no longer form a link.
        plain = CODE_SPAN.sub(lambda m: re.sub(r"[\[\]()]", " ", m.group(0)), line)
        found.extend((number, match.group(1)) for match in INLINE_LINK.finditer(plain))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """One line per link of ``page`` that names a missing file or anchor: where, the link, what is missing."""
    problems = []
    for number, raw in links(page.read_text(encoding="utf-8")):
        target = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto: and the like are not checked here
        path_part, _, fragment = target.partition("#")
        destination = Path(os.path.normpath(page.parent / unquote(path_part))) if path_part else page
        where = f"{_relative(page, root)}:{number}: link ({raw})"
        if not destination.exists():
            problems.append(f"{where}: no file {_relative(destination, root)}")
        elif fragment and destination.suffix == ".md" and unquote(fragment) not in _anchors(destination):
            problems.append(f"{where}: {_relative(destination, root)} has no heading or anchor #{unquote(fragment)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_relative_link_resolves(page: Path) -> None:
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


LONG_PAGES = [page for page in sorted(DOCS.rglob("*.md")) if "reference" not in page.relative_to(DOCS).parts]


@pytest.mark.parametrize("page", LONG_PAGES, ids=_relative)
def test_a_long_page_starts_with_a_table_of_contents(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    if len(lines) <= TOC_NEEDED_ABOVE:
        return
    in_page = sum(line.count("](#") for line in lines[:TOC_WITHIN])
    assert in_page >= TOC_MIN_LINKS, (
        f"{_relative(page)} has {len(lines)} lines but no table of contents: at least {TOC_MIN_LINKS} links "
        f"to its own sections (`](#...)`) in its first {TOC_WITHIN} lines")


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Secured cluster (SASL_SSL, mutual TLS, ACLs)", "secured-cluster-sasl_ssl-mutual-tls-acls"),
    ("G3 without a scan (`transactions.scan: auto`, the default)", "g3-without-a-scan-transactionsscan-auto-the-default"),
    ("Moving a pipeline: `tidemark offsets seek`", "moving-a-pipeline-tidemark-offsets-seek"),
    ("Months of history (`pipelines/maintain.py`)", "months-of-history-pipelinesmaintainpy"),
    ("`pipelines[].start`", "pipelinesstart"),
    ("Per-batch cost vs history", "per-batch-cost-vs-history"),
    ("The guarantees G1–G7", "the-guarantees-g1g7"),
    ("A [linked](other.md) heading", "a-linked-heading"),
    ("Quality checks (`quality/`, `tidemark check <pipeline>`)", "quality-checks-quality-tidemark-check-pipeline"),
    ("An <em>HTML</em> heading", "an-html-heading"),
])
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_get_numbered_anchors_and_code_blocks_none() -> None:
    text = "# Top\n\n## Settings\n\n```sh\n# not a heading\n[not](a-link.md)\n```\n\n### Settings\n\n## Settings\n"
    assert anchors_of(text) == {"top", "settings", "settings-1", "settings-2"}
    assert links(text) == []
    assert links("see [a](b.md#c), `[code](d.md)` and ![img](e.png \"title\")") == [(1, "b.md#c"), (1, "e.png")]


def test_a_link_to_a_missing_file_or_anchor_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## Here\n\n<a name=\"old-name\"></a>\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#here) [old](a.md#old-name) [gone](c.md) [nowhere](a.md#there) "
                    "[web](https://example.com/x.md)\n")
    problems = broken_links(page, tmp_path)
    assert len(problems) == 2, problems
    assert "b.md:1: link (c.md): no file" in problems[0]
    assert "b.md:1: link (a.md#there): a.md has no heading or anchor #there" in problems[1]
