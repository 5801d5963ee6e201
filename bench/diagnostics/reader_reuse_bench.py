"""Small batches with Spark's default of a fresh Kafka group id per read vs Tidemark's stable one.

Spark pools its executors' Kafka consumers by group id and partition, and a read that
names no ``kafka.group.id`` gets a fresh one: every batch then opens new consumers. In
Tidemark every read of one process with the same options uses one group id
(``pipelines.transform.reader_group``), so a batch reuses the consumers the last one left.

One process, one broker, one topic of 9 partitions; each contender ingests it in batches
of ``--batch`` records (``transactions.atomic: false``: only the read and write) into a
fresh target with ``IngestJob.run_bounded``. Contenders alternate over ``--reps`` rounds
(the first round warms the JVM and is left out); reported: seconds per batch, medians.

    .venv/bin/python -m bench.diagnostics.reader_reuse_bench --json reader_reuse.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=5400, help="records per batch (600 per partition by default)")
    parser.add_argument("--batches", type=int, default=10, help="batches per contender per round")
    parser.add_argument("--reps", type=int, default=4, help="rounds; the first warms up and is not counted")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    report_arguments(parser)
    args = parser.parse_args(argv)

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.spark import build_session
    from pipelines import transform
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config
    from tidemark.settings import load_settings

    load_before = loadavg()
    stable = transform.reader_group
    contenders = {"fresh group id per read (Spark's default)": lambda options: f"spark-like-{uuid.uuid4().hex}",
                  "stable group id (Tidemark)": stable}
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    work = Path(tempfile.mkdtemp(prefix="tidemark-reader-reuse-"))
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
        topic = f"reuse-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 9, 1)])[topic].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i in range(args.batch * args.batches):
            producer.produce(topic, json.dumps({"seq": i, "note": "x" * 200}).encode(), partition=i % 9)
            if i % 10_000 == 0:
                producer.poll(0)
        producer.flush(60)
        spark = build_session(load_settings(), "reader-reuse-bench")
        try:
            for rep in range(args.reps):
                order = list(contenders.items())
                for name, group in (order if rep % 2 else order[::-1]):
                    transform.reader_group = group  # type: ignore[assignment]
                    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [{
                        "name": f"reuse{rep}{len(seconds[name])}", "topics": [topic],
                        "target": str(work / f"{rep}-{uuid.uuid4().hex[:6]}"), "schema": "seq BIGINT, note STRING",
                        "max_records_per_batch": args.batch, "transactions": {"atomic": False}}]})
                    started = time.monotonic()
                    report = IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
                    per_batch = (time.monotonic() - started) / len(report.batches)
                    print(f"round {rep}: {name}: {len(report.batches)} batches, {per_batch:.3f} s each", flush=True)
                    if rep > 0:
                        seconds[name].append(per_batch)
        finally:
            transform.reader_group = stable
            spark.stop()

    medians = {name: statistics.median(s) for name, s in seconds.items()}
    fresh, kept = medians.values()
    lines = ["", *header("Small batches: a fresh Kafka group id per read vs a stable one", load_before),
             (f"Kafka {broker_version}, one broker; 9 partitions, batches of {args.batch:,} records of ~230 B; "
              f"{args.batches} batches per contender per round, {args.reps - 1} counted rounds."), "",
             "| contender | seconds per batch (median) | each round |", "|---|---:|---|"]
    for name, s in seconds.items():
        lines.append(f"| {name} | {medians[name]:.3f} | {', '.join(f'{x:.3f}' for x in s)} |")
    lines += ["", f"Stable / fresh: **{kept / fresh:.2f}x** the time per batch."]
    emit(lines, args.output)
    emit_json({"benchmark": "reader_reuse_bench", "batch": args.batch, "batches": args.batches,
               "seconds_per_batch": medians, "rounds": seconds, "ratio_stable_vs_fresh_time": kept / fresh},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
