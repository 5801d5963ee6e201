"""How the commands print: tables for people on a terminal, plain columns for scripts."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A table: drawn by rich on a terminal, plain aligned columns when piped (scripts parse those)."""
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table

        table = Table(*header, box=box.SIMPLE_HEAD)
        for row in rows:
            table.add_row(*map(str, row))
        console = Console()
        with console.capture() as captured:
            console.print(table)
        return captured.get().rstrip("\n")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
