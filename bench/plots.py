"""PNG charts of the benchmarks' JSON figures (matplotlib, no display needed).

Each benchmark script draws its chart with ``--png FILE`` from the same figures it writes
with ``--json FILE``; this module also redraws every chart from stored JSON files, so a
chart in docs/benchmarks.md always matches its JSON:

    .venv/bin/python -m bench.plots docs/bench        # each docs/bench/<name>.json -> <name>.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Figure = Any


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _footer(fig: Figure, data: dict[str, Any]) -> None:
    machine = data.get("machine") or {}
    fig.text(0.01, 0.01, f"{data.get('taken_at', '?')}; {machine.get('nproc', '?')} cores; "
             f"load after {data.get('load_after', '?')} (compare ratios, not absolute values)",
             fontsize=7, color="#666666")


def _grouped(title: str, groups: list[str], series: dict[str, list[float]], unit: str) -> Figure:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in values], fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.margins(y=0.3)  # headroom above the bars for the legend
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def relay(data: dict[str, Any]) -> Figure:
    sizes = sorted(data["by_txn_size"], key=int)
    names = ("relay", "nontxn-relay", "plain-producer")
    series = {n: [data["by_txn_size"][s][f"{n}_events_per_s"] for s in sizes] for n in names}
    return _grouped(f"Relay throughput, {data['events']:,} events (ratio relay / nontxn-relay: "
                    + ", ".join(f"{data['by_txn_size'][s]['ratio_vs_nontxn_relay']:.2f}×" for s in sizes) + ")",
                    [f"{s} event(s) per source txn" for s in sizes], series, "events/s")


def relay_format(data: dict[str, Any]) -> Figure:
    rate = data["events_per_s"]
    band = data["band"]
    return _grouped(f"Relay by value format, {data['events']:,} events in {data['txn_size']}-event source txns\n"
                    f"Avro {data['ratio_avro_vs_json']:.2f}× JSON (band {band['avro_vs_json'][0]:.2f}–"
                    f"{band['avro_vs_json'][1]:.2f}), Protobuf {data['ratio_protobuf_vs_json']:.2f}× JSON "
                    f"(band {band['protobuf_vs_json'][0]:.2f}–{band['protobuf_vs_json'][1]:.2f})",
                    [f"median of {data['reps']}"], {f"format: {n}": [rate[n]] for n in ("json", "avro", "protobuf")},
                    "events/s")


def g3(data: dict[str, Any]) -> Figure:
    seconds = data["seconds"]
    order = ("plain", "g3", "g3-scan", "g3+dedup", "g3-narrow", "g3-unrecorded", "g3-cut-only")
    names = [n for n in order if n in seconds] + sorted(set(seconds) - set(order))
    first = data.get("first_run_s", {})
    groups = ([f"first run (round 1 of {data.get('warmup_rounds', 1)} untimed)"] if first else []) + [
        f"steady: median of {data['reps']} after the warm-up"]
    series = {n: ([data["records"] / first[n]] if first else []) + [data["records"] / seconds[n]] for n in names}
    return _grouped(f"G3 cost, {data['records']:,} relay-written events (steady g3 / plain "
                    f"{data['ratio_g3_vs_plain']:.2f}×)", groups, series, "events/s")


def freshness(data: dict[str, Any]) -> Figure:
    contenders, first = data["contenders"], data.get("first", {})
    quantiles = ("p50", "p95", "p99", "max")
    series: dict[str, list[float]] = {}
    for name, steady in contenders.items():
        if name in first:
            series[f"{name}, first {data['warmup']:.0f} s"] = [first[name][q] for q in quantiles]
        series[f"{name}, steady" if name in first else name] = [steady[q] for q in quantiles]
    return _grouped(f"Freshness at {data['rate']:,} events/s: database commit to visible in Delta",
                    list(quantiles), series, "seconds")


def position(data: dict[str, Any]) -> Figure:
    seconds = data["seconds"]
    readers = sorted({k.split("@")[0] for k in seconds})
    sizes = sorted({k.split("@")[1] for k in seconds}, key=lambda s: int(s.replace(",", "")))
    series = {f"{s} positions": [seconds[f"{r}@{s}"] for r in readers] for s in sizes}
    return _grouped("Relay start-up: reading the position", readers, series, "seconds")


def status(data: dict[str, Any]) -> Figure:
    seconds = data["seconds"]
    return _grouped(f"Operator commands as new processes ({data['batches']} batches in the ledger)",
                    list(seconds), {"median": list(seconds.values())}, "seconds")


def history(data: dict[str, Any]) -> Figure:
    seconds = data["seconds_per_batch"]
    names = list(seconds)
    versions = [f"{n}\n({data['shapes'][n]['target']['version'] + 1:,} versions, "
                f"{data['shapes'][n]['target']['files']:,} files)" for n in names]
    series = {"mean s per batch": [seconds[n] for n in names]}
    if "restart_seconds" in data:
        series = {"first batch after a restart": [data["restart_seconds"][n] for n in names], **series}
    return _grouped(f"One {data['records']:,}-record batch vs history (maintained: "
                    f"{data['ratio_maintained']:.2f}×, unmaintained: {data['ratio_unmaintained']:.2f}×)",
                    versions, series, "seconds")


def history_day(data: dict[str, Any]) -> Figure:
    roles = list(data["before"])
    return _grouped(f"A simulated day ({data['versions']:,} versions), then one maintain: files per table",
                    roles, {"before": [data["before"][r]["files"] for r in roles],
                            "after": [data["after"][r]["files"] for r in roles]}, "files")


def ingest(data: dict[str, Any]) -> Figure:
    med = data["median_seconds"]
    names = [n for n in ("tidemark", "structured-streaming", "read-only", "write-only") if n in med]
    return _grouped(f"Ingest of {data['records']:,} records, G3 {data['g3']} (vs Structured Streaming "
                    f"{data['ratio_vs_structured_streaming']:.2f}×, vs the limit {data['ratio_vs_limit']:.2f}×)",
                    ["throughput"], {n: [data["records"] / med[n]] for n in names}, "records/s")


def avro(data: dict[str, Any]) -> Figure:
    med = data["median_seconds"]
    names = [n for n in ("tidemark-avro", "structured-streaming-avro", "tidemark-json", "tidemark-protobuf")
             if n in med]
    protobuf = data.get("ratio_protobuf_vs_avro")
    return _grouped(f"{data['records']:,} records, three writer versions"
                    + (f": Protobuf {protobuf:.2f}× Avro" if protobuf is not None else "")
                    + f"\nAvro {data['ratio_vs_structured_streaming']:.2f}× Structured Streaming (from_avro), "
                    f"{data['ratio_vs_json']:.2f}× Tidemark's JSON",
                    ["throughput"], {n: [data["records"] / med[n]] for n in names}, "records/s")


def s3(data: dict[str, Any]) -> Figure:
    med = data["median_seconds"]
    names = [n for n in ("tidemark-local", "tidemark-s3", "structured-streaming-s3") if n in med]
    return _grouped(f"{data['records']:,} records to s3a://: {data['ratio_s3_vs_local']:.2f}× local, "
                    f"{data['ratio_vs_structured_streaming_s3']:.2f}× Structured Streaming on S3",
                    ["throughput"], {n: [data["records"] / med[n]] for n in names}, "records/s")


def history_properties(data: dict[str, Any]) -> Figure:
    summary = data["summary"]
    return _grouped(f"Table properties: seconds per {data['records']:,}-record batch ({data['batches']} batches)",
                    ["mean", "p95", "max"], {n: [s["mean"], s["p95"], s["max"]] for n, s in summary.items()},
                    "seconds")


def serve(data: dict[str, Any]) -> Figure:
    modes = data["modes"]
    runs = min(len(m["seconds_before_fetching"]) for m in modes.values())
    return _grouped(f"Served runs: seconds from the run's start to its first fetch (cold/warm "
                    f"{data['ratio_cold_vs_warm']:.1f}× on runs 2+)", [f"run {i + 1}" for i in range(runs)],
                    {mode: m["seconds_before_fetching"][:runs] for mode, m in modes.items()}, "seconds")


def reader_reuse(data: dict[str, Any]) -> Figure:
    seconds = data["seconds_per_batch"]
    return _grouped(f"Seconds per {data['batch']:,}-record batch (stable/fresh group id "
                    f"{data['ratio_stable_vs_fresh_time']:.2f}×)", list(seconds), {"median": list(seconds.values())},
                    "seconds")


def revisions(data: dict[str, Any]) -> Figure:
    medians = data["medians"]
    keys = [k for k in medians["head"] if k not in ("events", "rows", "records")]  # counts, not figures
    return _grouped(f"{data['measured'][0]}: {data['pick']}, medians of {len(data['runs']['head'])} runs",
                    keys, {f"base {data['base']}": [medians["base"][k] for k in keys],
                           f"head {data.get('head', '')}".strip(): [medians["head"][k] for k in keys]}, "")


def local_fs(data: dict[str, Any]) -> Figure:
    medians = data["medians"]
    return _grouped(f"A {data['rows']:,}-row Delta append (Tidemark's / Hadoop's wall "
                    f"{data['ratio_wall_tidemark_vs_hadoop']:.2f}×)", ["wall s", "CPU s"],
                    {name: [m["wall_s"], m["cpu_s"]] for name, m in medians.items()}, "seconds")


def jit(data: dict[str, Any]) -> Figure:
    summary = data["summary"]
    return _grouped(f"The same {data['records']:,}-record ingest again in one driver (warm: runs "
                    f"{data['settled_from_run']}-{data['runs']}; Tidemark / HotSpot defaults "
                    f"{data['ratio_warm_seconds']:.2f}×)", ["warm run s", "its JIT s"],
                    {name: [f["warm_s"], f["warm_jit_s"]] for name, f in summary.items()}, "seconds")


def cold_start(data: dict[str, Any]) -> Figure:
    medians = data["medians"]
    return _grouped(f"A cold process, {data['records']:,} records (ingest without / with the class archive "
                    f"{data['ratio_ingest_without_vs_with']:.2f}×)", ["tidemark ingest s", "session start+stop s"],
                    {name: [m["ingest_s"], m["session_s"]] for name, m in medians.items()}, "seconds")


def read_heap(data: dict[str, Any]) -> Figure:
    med = data["median_kept_mib"]
    fetches = list(med)
    sizes = list(med[fetches[0]])
    return _grouped(f"Heap a read of {data['partitions']} partitions × ~{data['partition_mb']} MB leaves reachable",
                    [f"{f} MiB fetches" for f in fetches],
                    {f"{s} B records": [med[f][s] for f in fetches] for s in sizes}, "MiB")


def reader(data: dict[str, Any]) -> Figure:
    names = data["readers"]
    ratio = data.get("ratio_v1_vs_v2_time")
    return _grouped(f"{data['committed_records']:,} committed records read over exact ranges and counted"
                    + (f" (time V1 / V2 {ratio:.2f}×)" if ratio is not None else ""),
                    ["wall s", "driver JVM CPU s"],
                    {n: [data["median_seconds"][n], data["median_driver_cpu_seconds"][n]] for n in names}, "seconds")


CHARTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "cold_start_bench": cold_start, "read_heap_bench": read_heap, "reader_bench": reader,
    "revisions": revisions, "jit_bench": jit, "local_fs_bench": local_fs,
    "reader_reuse_bench": reader_reuse, "ingest_bench": ingest, "serve_bench": serve, "history_properties": history_properties,
    "relay_bench": relay, "relay_format_bench": relay_format, "g3_bench": g3, "freshness_bench": freshness, "position_bench": position,
    "status_bench": status, "history_bench": history, "history_day": history_day, "s3_bench": s3,
    "avro_bench": avro,
}


def save(data: dict[str, Any], path: str | Path | None) -> None:
    """Draw ``data`` (a benchmark's JSON figures) to the PNG ``path``; nothing without a path."""
    if not path:
        return
    chart = CHARTS.get(str(data.get("benchmark")))
    if chart is None:
        raise ValueError(f"no chart for benchmark {data.get('benchmark')!r}; known: {', '.join(CHARTS)}")
    fig = chart(data)
    _footer(fig, data)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="where the benchmarks' JSON files are (docs/bench)")
    args = parser.parse_args(argv)
    drawn = 0
    for source in sorted(Path(args.directory).glob("*.json")):
        data = json.loads(source.read_text())
        if data.get("benchmark") in CHARTS:
            save(data, source.with_suffix(".png"))
            print(f"{source.with_suffix('.png')}")
            drawn += 1
    return 0 if drawn else 1


if __name__ == "__main__":
    sys.exit(main())
