"""What the driver's class archive (infra.cds) saves a cold ``tidemark ingest`` process.

A scheduled run outside ``tidemark serve``, a restart after a crash, and every process the
SIGKILL tests kill start their own driver JVM. Here the same small ingest runs as a whole
process, side by side with ``spark.class_data_sharing`` on and off
(``TIDEMARK_SPARK__CLASS_DATA_SHARING``), alternating in every rep so that each pair shares
the moment's load; and so does a process that only starts and stops a session. Each
ingest's table is checked: exactly the topic's records. Reported: medians, per-pair ratios
(seconds without / with), ``--json FILE``.

    .venv/bin/python -m bench.diagnostics.cold_start_bench --reps 5 --json cold_start.json --png cold_start.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.ingest_bench import SCHEMA, SESSION_ONLY, _delta_rows, new_topic, process_run, produce

CONTENDERS = {"with archive": "true", "without": "false"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bootstrap", help="an existing broker; default: a fresh embedded one")
    report_arguments(parser)
    args = parser.parse_args(argv)

    import yaml

    from infra import cds
    from tidemark.settings import load_settings

    archive = cds.driver_archive(load_settings().home_dir)
    if not archive.is_file():
        print(f"no class archive at {archive}: run `make bootstrap` first", file=sys.stderr)
        return 2
    load_before = loadavg()
    tidemark = str(Path(sys.executable).with_name("tidemark"))
    runs: dict[str, dict[str, list[float]]] = {name: {"ingest_s": [], "session_s": []} for name in CONTENDERS}
    with kafka_broker(args.bootstrap) as (bootstrap, _), tempfile.TemporaryDirectory(prefix="cold-") as tmp:
        work = Path(tmp)
        topic = new_topic(bootstrap, "bench-cold")
        produce(bootstrap, topic, args.records, value_bytes=args.value_bytes, txn_size=10, seed=7)
        for rep in range(args.reps):
            order = list(CONTENDERS) if rep % 2 == 0 else list(reversed(CONTENDERS))
            for name in order:
                env = {**os.environ, "TIDEMARK_SPARK__CLASS_DATA_SHARING": CONTENDERS[name]}
                target = work / f"t-{rep}-{CONTENDERS[name]}"
                config = work / f"{target.name}.yaml"
                config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
                    {"name": "bench", "topics": [topic], "target": str(target), "schema": SCHEMA}]}))
                seconds, _ = process_run([tidemark, "ingest", "bench", "--config", str(config)], work, env=env)
                rows = _delta_rows(target)
                if rows != args.records:
                    raise AssertionError(f"{name}: the table holds {rows} rows, the topic {args.records} records")
                runs[name]["ingest_s"].append(seconds)
                started = time.perf_counter()
                process_run([sys.executable, "-c", SESSION_ONLY], work, env=env)
                runs[name]["session_s"].append(time.perf_counter() - started)
                print(f"rep {rep + 1} {name}: ingest {seconds:.1f}s, session start+stop "
                      f"{runs[name]['session_s'][-1]:.1f}s", flush=True)

    med = {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in runs.items()}
    on, off = runs["with archive"], runs["without"]
    pairs = {k: [b / a for a, b in zip(on[k], off[k], strict=True)] for k in ("ingest_s", "session_s")}
    lines = [*header("A cold `tidemark ingest` process with and without the driver's class archive", load_before),
             "", (f"{args.records:,} records of ~{args.value_bytes} B in 8 partitions, transactions of 10; "
                  f"archive {archive.name} ({archive.stat().st_size / 2**20:.0f} MiB); {args.reps} reps, alternating."),
             "",
             "| process | with archive s (median) | without s (median) | without / with, per pair |",
             "|---|---:|---:|---|"]
    for key, label in (("ingest_s", "`tidemark ingest bench`"), ("session_s", "session start + stop only")):
        lines.append(f"| {label} | {med['with archive'][key]:.1f} | {med['without'][key]:.1f} | "
                     f"{', '.join(f'{r:.2f}' for r in pairs[key])} (median {statistics.median(pairs[key]):.2f}×) |")
    emit(lines, args.output)
    emit_json({"benchmark": "cold_start_bench", "records": args.records, "reps": args.reps, "runs": runs,
               "medians": med, "ratio_without_vs_with_paired": pairs,
               "ratio_ingest_without_vs_with": statistics.median(pairs["ingest_s"]),
               "archive_bytes": archive.stat().st_size}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
