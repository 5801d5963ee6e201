"""What every benchmark needs: the machine it ran on, a throwaway broker, one report format.

Benchmarks compare contenders side by side in one run and report ratios; absolute
seconds on a shared 2-core machine are noise. Each report names the command, the
machine, the load average and the date, so a number on the results page (docs/benchmarks.md) can be re-run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = "?"
    try:
        kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")).split()[1])
        memory = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return {"nproc": str(os.cpu_count()), "cpu": model, "memory": memory,
            "kernel": platform.release(), "python": platform.python_version()}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def busy_cpu_seconds() -> float | None:
    """CPU seconds this machine's cores have spent busy since boot, summed over all cores (``/proc/stat``), or None.

    Over a run, the difference divided by its wall time is how many cores were busy: whether
    a contender (with the broker serving it) had the machine to itself or left cores free.
    Steal (time the hypervisor gave another guest) is not counted: on a shared VM a run that
    wants every core can show a little less than all of them.
    """
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def header(title: str, load_before: str) -> list[str]:
    """The lines every report starts with: what, when, how to re-run, on what."""
    m = machine()
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name if spec is not None else sys.argv[0]
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "-m", module, *sys.argv[1:]])
    return [
        f"## {title} ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{command}`  ",
        (f"Machine: {m['nproc']} cores ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}, "
        f"Python {m['python']}; load average before/after {load_before} / {loadavg()} "
        "(shared machine: compare ratios, not absolute numbers)."),
    ]


@contextmanager
def kafka_broker(bootstrap: str | None = None) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, broker version): ``bootstrap`` if given, else a fresh embedded broker."""
    if bootstrap:
        yield bootstrap, "external"
        return
    from infra import jars as jar_cache
    from infra.kafka import EmbeddedKafka
    from infra.process import free_port_block
    from tidemark.settings import load_settings

    settings = load_settings()
    state = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    jars = jar_cache.resolve(settings.home_dir, "kafka")
    cluster = EmbeddedKafka(state / "kafka", jars, port=free_port_block(2, start=28092), heap=settings.kafka.heap)
    print(f"starting Kafka on {cluster.bootstrap_servers} (state {state}) ...", flush=True)
    cluster.start()
    try:
        yield cluster.bootstrap_servers, cluster.version
    finally:
        from pipelines.transactions.consumers import ManifestConsumers

        # Kept manifest consumers would retry the stopped broker until they expire. (A base
        # revision measured by bench.revisions may predate keeping them.)
        close_idle = getattr(ManifestConsumers, "close_idle", None)
        if close_idle is not None:
            close_idle()
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)  # a 1M-record run leaves ~1 GB of log segments


def emit(lines: list[str], output: str | None) -> None:
    """Print a report, and write it to ``output`` too when given (``--output FILE``)."""
    report = "\n".join(lines)
    print(report, flush=True)
    if output:
        Path(output).write_text(report + "\n")


def report_arguments(parser: argparse.ArgumentParser) -> None:
    """``--output``, ``--json`` and ``--png``: where a benchmark writes its report, figures and chart."""
    parser.add_argument("--output", help="also write the markdown report to this file")
    parser.add_argument("--json", help="write the figures as JSON to this file")
    parser.add_argument("--png", help="draw the figures as a PNG chart to this file (bench.plots)")


def emit_json(data: dict[str, object], path: str | None, *, png: str | None = None) -> None:
    """Write a benchmark's figures as JSON (``--json FILE``), with when and where they were taken,
    and with ``png`` (``--png FILE``) their chart (``bench.plots``)."""
    import json

    payload = {"taken_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
               "load_after": loadavg(), "command": " ".join(sys.argv), **data}
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if png:
        from bench import plots

        plots.save(payload, png)


def bars_svg(path: str, title: str, bars: dict[str, float], unit: str) -> None:
    """A horizontal bar chart as SVG (no plotting library needed): one bar per contender."""
    from html import escape

    width, row, left = 640, 34, 190
    top = 40
    biggest = max(bars.values()) or 1.0
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + row * len(bars) + 20}" '
              'font-family="sans-serif" font-size="13">'),
             f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    for i, (name, value) in enumerate(bars.items()):
        y = top + i * row
        length = (width - left - 110) * value / biggest
        parts += [f'<text x="10" y="{y + 17}">{escape(name)}</text>',
                  f'<rect x="{left}" y="{y + 4}" width="{length:.1f}" height="{row - 12}" fill="#4a7fb5"/>',
                  f'<text x="{left + length + 6:.1f}" y="{y + 17}">{value:,.2f} {escape(unit)}</text>']
    parts.append("</svg>")
    Path(path).write_text("\n".join(parts) + "\n")
