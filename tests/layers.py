"""Which package imports which: the project's floors, read from its own import lines.

Run ``python -m tests.layers`` to print the package graph, floor by floor, with every
import that runs upward or in a cycle spelled out file by file. The unit test
``tests/unit/test_layers.py`` holds the rule this prints: the ground package imports no
other, every import runs down the floors below, and no module takes part in a cycle.

Imports inside ``if TYPE_CHECKING:`` count: a type a module names is a dependency a reader
has to follow, even if Python does not load it at run time.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The floors, from the ground up: a package may import its own floor's modules and any
# floor below. Packages on one floor do not import each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("tidemark",),  # the ground: errors, settings, config, storage, logs
    ("connectors",),  # Kafka clients: configs, admin, producer, readers, preflight
    ("offsets", "outbox", "infra"),  # the commit protocol; the relay; the embedded stack and the JVM
    ("pipelines",),  # ingest, backfill, maintenance: Spark jobs over the three below
    ("quality",),  # checks of what the pipelines wrote
    ("orchestration",),  # schedules, the warm driver, status, metrics, the demo
    ("tidemark.cli",),  # the `tidemark` command: a package of its own inside `tidemark`
)
NAMES = tuple(p for floor in FLOORS for p in floor)
"""Each floor's packages; a dotted name is a subpackage that stands on its own floor."""
PACKAGES = tuple(dict.fromkeys(name.split(".")[0] for name in NAMES))
"""The top-level folders the project's modules live in."""


def package_of(module: str) -> str:
    """The floor package ``module`` belongs to: the longest of :data:`NAMES` it lies in."""
    found = [n for n in NAMES if module == n or module.startswith(n + ".")]
    if not found:
        raise ValueError(f"{module} is in no floor: add its package to tests/layers.py FLOORS")
    return max(found, key=len)


@dataclass(frozen=True)
class Edge:
    """One import line: the module that imports, the module it names, and where."""

    source: str
    target: str
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _imported(node: ast.AST, current: str, is_package: bool) -> Iterable[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = current.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        # `from pkg import mod` names a module when pkg/mod.py exists.
        names = []
        for alias in node.names:
            candidate = f"{stem}.{alias.name}"
            if _module_path(candidate) is not None:
                names.append(candidate)
            else:
                names.append(stem)
        return names
    return []


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def edges() -> list[Edge]:
    """Every import between the project's own modules, with its line."""
    found: list[Edge] = []
    for path in project_modules():
        source = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for target in _imported(node, source, path.name == "__init__.py"):
                top = target.split(".")[0]
                if top in PACKAGES and target != source and _module_path(target) is not None:
                    found.append(Edge(source, target, getattr(node, "lineno", 0)))
    return found


def floor_of(module: str) -> int:
    package = package_of(module)
    return next(index for index, floor in enumerate(FLOORS) if package in floor)


def upward(found: Iterable[Edge]) -> list[Edge]:
    """Imports that reach a higher floor, or across to another package of the same floor."""
    wrong = []
    for edge in found:
        src, dst = package_of(edge.source), package_of(edge.target)
        if src == dst:
            continue
        if floor_of(edge.target) >= floor_of(edge.source):
            wrong.append(edge)
    return wrong


def cycles(found: Iterable[Edge]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def report() -> str:
    found = edges()
    lines = ["floors, top first (a package imports only the floors below it):"]
    by_package: dict[str, set[str]] = {}
    for edge in found:
        src, dst = package_of(edge.source), package_of(edge.target)
        if src != dst:
            by_package.setdefault(src, set()).add(dst)
    for number in range(len(FLOORS) - 1, -1, -1):
        for package in FLOORS[number]:
            imports = ", ".join(sorted(by_package.get(package, ()))) or "nothing"
            lines.append(f"  {number}  {package:<14} imports {imports}")
    wrong = upward(found)
    lines.append(f"imports that run upward or across: {len(wrong)}")
    lines += [f"  {e.source} -> {e.target}  (line {e.line})" for e in wrong]
    groups = cycles(found)
    lines.append(f"cycles: {len(groups)}")
    lines += ["  " + " <-> ".join(group) for group in groups]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
