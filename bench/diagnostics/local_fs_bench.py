"""Hadoop's local file system against Tidemark's (io.tidemark.fs): a small Delta append's time and CPU.

Without Hadoop's native library, Hadoop's local file system starts a ``chmod`` after
creating each file and a ``readlink`` for each file a Delta commit renames. Each
contender is a fresh session in its own process (Hadoop picks its file system when the
JVM starts), alternating over ``--rounds``; each makes a table of 5 appends, then times
``--appends`` more of ``--rows`` rows in 2 files with ``txnAppId``/``txnVersion`` as
Tidemark's step 4 writes them (the snapshot state that check needs included, as in a
follower batch without the warm-up). Reported per contender: median wall seconds and
median CPU seconds of the JVM and the processes it started, per append.

    .venv/bin/python -m bench.diagnostics.local_fs_bench --json local_fs.json --png local_fs.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import emit, emit_json, header, loadavg, report_arguments

HADOOPS = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
           "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.LocalFs"}
CONTENDERS = ("hadoop", "tidemark")


def child(contender: str, rows: int, appends: int) -> dict[str, object]:
    """One contender in this process: its file system and the median wall and CPU seconds of an append."""
    from infra.spark import build_session
    from tidemark.settings import load_settings

    spark = build_session(load_settings(), f"local-fs-{contender}", extra=HADOOPS if contender == "hadoop" else None)
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:  # the JVM's own and its waited-for children's (chmod, readlink)
        fields = open(f"/proc/{jvm_pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        return sum(int(f) for f in fields[11:15]) / tick

    fs = spark._jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    path = tempfile.mkdtemp(prefix="tidemark-local-fs-") + "/t"
    df = spark.range(rows).selectExpr("id", "cast(id as string) as s", "uuid() as u").coalesce(2)

    def append(version: int) -> None:
        df.write.format("delta").mode("append").option("txnAppId", "bench").option("txnVersion", version).save(path)

    for version in range(5):
        append(version)
    walls, cpus = [], []
    for version in range(5, 5 + appends):
        c0, t0 = cpu(), time.perf_counter()
        append(version)
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu() - c0)
    name = fs.getRawFileSystem().getClass().getName()
    spark.stop()
    return {"file_system": name, "wall_s": statistics.median(walls),
            "cpu_s": statistics.median(cpus)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--appends", type=int, default=20, help="timed appends per contender and round")
    parser.add_argument("--rounds", type=int, default=2)
    report_arguments(parser)
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.appends)))
        return 0

    load_before = loadavg()
    runs: dict[str, list[dict[str, object]]] = {c: [] for c in CONTENDERS}
    for r in range(args.rounds):
        for contender in CONTENDERS if r % 2 == 0 else tuple(reversed(CONTENDERS)):
            out = subprocess.run([sys.executable, "-m", "bench.diagnostics.local_fs_bench", "--child", contender, "--rows",
                                  str(args.rows), "--appends", str(args.appends)],
                                 capture_output=True, text=True, check=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
            runs[contender].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {contender}: {runs[contender][-1]}", flush=True)
    medians = {c: {k: statistics.median(float(run[k]) for run in rs) for k in ("wall_s", "cpu_s")}  # type: ignore[arg-type]
               for c, rs in runs.items()}
    lines = ["", *header("Local file system: a small Delta append, Hadoop's against Tidemark's", load_before),
             (f"{args.rows:,} rows in 2 files per append, {args.appends} timed appends per contender and round, "
             f"{args.rounds} rounds alternating; medians."), "",
             "| file system | wall s per append | CPU s per append (JVM and its processes) |", "|---|---:|---:|"]
    for c, m in medians.items():
        lines.append(f"| {c} | {m['wall_s']:.3f} | {m['cpu_s']:.3f} |")
    ratio = medians["tidemark"]["wall_s"] / medians["hadoop"]["wall_s"]
    lines += ["", (f"Tidemark's / Hadoop's wall time: {ratio:.2f}×; CPU: "
              f"{medians['tidemark']['cpu_s'] / medians['hadoop']['cpu_s']:.2f}×")]
    emit(lines, args.output)
    emit_json({"benchmark": "local_fs_bench", "rows": args.rows, "appends": args.appends, "rounds": args.rounds,
               "runs": runs, "medians": medians, "ratio_wall_tidemark_vs_hadoop": ratio,
               "ratio_cpu_tidemark_vs_hadoop": medians["tidemark"]["cpu_s"] / medians["hadoop"]["cpu_s"]},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
