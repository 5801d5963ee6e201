"""What HotSpot's JIT costs a warm driver: the same ingest run again and again in one session,
with Tidemark's JIT thresholds (``infra.spark.JIT_OPTIONS``) and with HotSpot's defaults.

A throwaway broker gets ``--records`` JSON values of about 1 KB (``bench.ingest_bench``'s
records, in producer transactions of 20). Each setting then runs in its own process (JIT
flags belong to a JVM), ``--processes`` times, alternating: one SparkSession, ``--runs``
bounded ingests of the whole topic into fresh tables, each timed, and the seconds the JVM's
compilers spent meanwhile (``CompilationMXBean.getTotalCompilationTime``: both compilers'
threads, on cores the tasks want too). Reported per setting: the first run (a cold JVM), and
the medians over the runs from the fifth on (a driver that has run a few batches: ``serve``,
``--follow``), pooled over the processes; ``--json FILE`` writes them with
``ratio_warm_seconds`` (Tidemark's / HotSpot defaults').

    .venv/bin/python -m bench.diagnostics.jit_bench --records 200000 --runs 8 --processes 2 --json jit.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments

SETTINGS = ("tidemark", "hotspot-defaults")
SETTLED_FROM = 4
"""Runs before this index (0-based) are the JVM's first; the rest are a warm driver's."""


def child(bootstrap: str, topic: str, runs: int, setting: str, work: Path) -> None:
    """One process: ``runs`` ingests in one session, a JSON line per run on stdout."""
    from bench.ingest_bench import run_tidemark, verify
    from infra.spark import JIT_OPTIONS, build_session, spark_conf
    from tidemark.settings import load_settings

    settings = load_settings()
    options = spark_conf(settings)["spark.driver.extraJavaOptions"]
    if setting == "hotspot-defaults":
        options = options.replace(JIT_OPTIONS, "")
    spark = build_session(settings, f"tidemark-jit-bench-{setting}", warehouse=work / "warehouse",
                          extra={"spark.driver.extraJavaOptions": options})
    try:
        jvm = spark._jvm
        assert jvm is not None  # a running session has its gateway
        compilers = jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        for run in range(runs):
            target = work / f"run-{run}"
            compiled = compilers.getTotalCompilationTime()
            started = time.perf_counter()
            rows, _ = run_tidemark(spark, bootstrap, topic, target)
            seconds = time.perf_counter() - started
            jit = (compilers.getTotalCompilationTime() - compiled) / 1000
            verify(spark, target, rows)
            print(json.dumps({"run": run, "seconds": seconds, "jit_seconds": jit, "rows": rows}), flush=True)
            shutil.rmtree(target, ignore_errors=True)
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2, help="processes per setting, alternating")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--child", nargs=3, metavar=("TOPIC", "SETTING", "WORK"), help=argparse.SUPPRESS)
    report_arguments(parser)
    args = parser.parse_args(argv)
    if args.child:
        topic, setting, work = args.child
        child(args.bootstrap, topic, args.runs, setting, Path(work))
        return 0
    if args.runs <= SETTLED_FROM:
        parser.error(f"--runs must be more than {SETTLED_FROM}: the runs from the fifth on are the figure")

    from bench.ingest_bench import PARTITIONS, new_topic, produce

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-jit-bench-"))
    figures: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _):
            topic = new_topic(bootstrap, "bench-jit")
            produce(bootstrap, topic, args.records, value_bytes=1000, txn_size=20, seed=7)
            for process in range(args.processes):
                for setting in SETTINGS if process % 2 == 0 else reversed(SETTINGS):
                    place = work / f"{setting}-{process}"
                    place.mkdir()
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.diagnostics.jit_bench", "--bootstrap", bootstrap, "--runs", str(args.runs),
                         "--child", topic, setting, str(place)],
                        capture_output=True, text=True, check=False)
                    if out.returncode != 0:
                        raise RuntimeError(f"{setting} process exited {out.returncode}:\n{out.stderr[-3000:]}")
                    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
                    if len(runs) != args.runs or any(r["rows"] != args.records for r in runs):
                        raise AssertionError(f"{setting}: {runs}")
                    figures[setting].append({"seconds": [r["seconds"] for r in runs],
                                             "jit_seconds": [r["jit_seconds"] for r in runs]})
                    print(f"{setting} process {process + 1}: " + ", ".join(
                        f"{r['seconds']:.2f}s (JIT {r['jit_seconds']:.1f}s)" for r in runs), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def pooled(setting: str, key: str, warm: bool) -> float:
        values = [v for p in figures[setting] for v in (p[key][SETTLED_FROM:] if warm else p[key][:1])]
        return statistics.median(values)

    summary = {s: {"first_s": pooled(s, "seconds", False), "first_jit_s": pooled(s, "jit_seconds", False),
                   "warm_s": pooled(s, "seconds", True), "warm_jit_s": pooled(s, "jit_seconds", True)}
               for s in SETTINGS}
    ratio = summary["tidemark"]["warm_s"] / summary["hotspot-defaults"]["warm_s"]
    lines = ["", *header("JIT cost of a warm driver: Tidemark's thresholds vs HotSpot's defaults", load_before),
             (f"Data: {args.records:,} records of ~1 KB over {PARTITIONS} partitions; per setting {args.processes} "
              f"process(es) of {args.runs} ingests of the whole topic in one session, alternating; "
              f"'warm' pools runs {SETTLED_FROM + 1}-{args.runs}."), "",
             "| setting | first run s | its JIT s | warm run s (median) | their JIT s (median) |",
             "|---|---:|---:|---:|---:|"]
    for s in SETTINGS:
        f = summary[s]
        lines.append(f"| {s} | {f['first_s']:.2f} | {f['first_jit_s']:.1f} | {f['warm_s']:.2f} | "
                     f"{f['warm_jit_s']:.2f} |")
    lines += ["", f"Warm runs with Tidemark's thresholds took {ratio:.2f}× the time of HotSpot's defaults."]
    emit(lines, args.output)
    emit_json({"benchmark": "jit_bench", "records": args.records, "runs": args.runs, "processes": args.processes,
               "settled_from_run": SETTLED_FROM + 1, "summary": summary, "per_process": figures,
               "ratio_warm_seconds": ratio}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
