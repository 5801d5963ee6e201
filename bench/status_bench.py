"""``tidemark status`` and ``tidemark offsets show`` as a user runs them, vs the same reads through Spark.

A fresh broker gets a topic (4 partitions) and a pipeline ingests it in ``--batches``
batches, so its ledger has history. Then, side by side in alternating order, each as a
whole new process (what an operator pays):

* ``status``: ``tidemark status --no-relay`` (the ledger read by delta-rs, no JVM);
* ``offsets-show``: ``tidemark offsets show <pipeline>``;
* ``spark-status``: what ``tidemark status`` would cost through Spark — a Spark session, the
  newest intent through ``offsets.ledger.Ledger``, the same Kafka lag read.

``--json FILE`` writes each contender's median seconds and ``ratio_spark_vs_status``.

    .venv/bin/python -m bench.status_bench                 # 20 batches, 3 reps
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments

_SPARK_STATUS = """
import sys
from infra.spark import build_session
from offsets.lag import partition_lags
from offsets.ledger import Ledger
from orchestration.context import pipeline_context
from tidemark.settings import load_settings
ctx = pipeline_context(sys.argv[1], "bench")
spark = build_session(load_settings(), "tidemark-status")
try:
    last = Ledger(spark, ctx.pipeline.ledger_path, "bench").last()
finally:
    spark.stop()
lags = partition_lags(ctx.client_config, ctx.pipeline, last.ends() if last else {})
print(last.batch_id, sum(x.lag for x in lags))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    report_arguments(parser)
    args = parser.parse_args(argv)

    import yaml
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.spark import build_session
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config
    from tidemark.settings import load_settings

    load_before = loadavg()
    times: dict[str, list[float]] = {}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
        topic = f"bench.status.{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(topic, 4, 1)]).values():
            future.result(30)
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(args.batches * 100):
            producer.produce(topic, json.dumps({"id": i}).encode(), str(i).encode())
        producer.flush(30)
        work = Path(tempfile.mkdtemp(prefix="tidemark-status-bench-"))
        raw = {"kafka": {"bootstrap_servers": bootstrap},
               "pipelines": [{"name": "bench", "topics": [topic], "target": str(work / "bench"),
                              "schema": "id INT", "max_records_per_batch": 100}]}
        config_path = work / "tidemark.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        config = parse_config(raw)
        spark = build_session(load_settings(), "status-bench-fill")
        try:
            report = IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
        finally:
            spark.stop()
        print(f"ingested {report.rows} records in {len(report.batches)} batches", flush=True)
        tidemark = [sys.executable, "-m", "tidemark.cli"]
        contenders = {
            "status": [*tidemark, "status", "--no-relay", "--config", str(config_path)],
            "offsets-show": [*tidemark, "offsets", "show", "bench", "--config", str(config_path)],
            "spark-status": [sys.executable, "-c", _SPARK_STATUS, str(config_path)],
        }
        for rep in range(args.reps):
            order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
            for name in order:
                started = time.perf_counter()
                subprocess.run(contenders[name], check=True, capture_output=True, timeout=300)
                elapsed = time.perf_counter() - started
                times.setdefault(name, []).append(elapsed)
                print(f"rep {rep + 1} {name}: {elapsed:.2f}s", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["spark-status"] / med["status"]
    lines = ["", *header("Operator commands: status without a JVM", load_before),
             (f"Kafka {broker_version}, one broker; a ledger of {args.batches} batches; each command a new "
             f"process; medians of {args.reps} reps."), "",
             "| command | median s | all runs (s) |", "|---|---:|---|"]
    for name in contenders:
        lines.append(f"| {name} | {med[name]:.2f} | {', '.join(f'{t:.2f}' for t in times[name])} |")
    lines += ["", (f"**`tidemark status` {med['status']:.2f} s; through Spark {med['spark-status']:.2f} s "
                  f"({ratio:.1f}× longer).**")]
    emit(lines, args.output)
    emit_json({"benchmark": "status_bench", "batches": args.batches, "reps": args.reps,
               "seconds": med, "runs": times, "ratio_spark_vs_status": ratio}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
