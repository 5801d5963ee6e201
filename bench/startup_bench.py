"""R2: a run's time to its first commit does not grow with the pipeline's history.

For each history size (default 10 and 2,000 batches) a pipeline is given that many
batches of history, then a fresh ``IngestJob`` — no in-process state, as after a restart
— runs one new batch of one record: recover (ledger, target and quarantine history),
plan, claim, commit, settle marker. The time of that batch is the start-up cost (the JVM's own
start is the same for any history and is left out). Sizes alternate over ``--reps``.

How the history is made: committing 2,000 batches one by one through the protocol takes
hours on 2 cores, so the history is written with the protocol's own writer options
(``txnAppId``/``txnVersion``/``userMetadata``) in commits of up to 100 batches each:
one ledger row and one target data file per batch (rows read from Kafka by the real
transform), and a quarantine commit per chunk. Table sizes, file counts, checkpoints,
``txn`` versions and the newest commits' metadata are what a real pipeline of that age
has; only the number of commits is smaller (20 instead of 2,000 per table), and Delta
reads a checkpoint plus at most 10 commit files either way.

    .venv/bin/python -m bench.startup_bench                 # 10 vs 2,000 batches, 3 reps
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import header, kafka_broker, loadavg

CHUNK = 100


def make_history(spark: Any, config: Any, pipeline: Any, bootstrap: str, batches: int) -> None:
    """``batches`` committed batches, batch ``b`` holding the record at offset ``b - 1``."""
    from pyspark.sql import functions as F

    from connectors.kafka_config import spark_options
    from offsets.ledger import LEDGER_SCHEMA, Intent, Range, now_utc
    from offsets.protocol import ERROR_COLUMN
    from pipelines.transform import frames

    topic = pipeline.topics[0]
    start = now_utc() - timedelta(hours=1)
    intents = [Intent(pipeline.name, b, "history", start + timedelta(seconds=b), (Range(topic, 0, b - 1, b),))
               for b in range(1, batches + 1)]
    everything = Intent(pipeline.name, 0, "history", start, (Range(topic, 0, 0, batches),))
    built = frames(spark, spark_options(config.kafka, bootstrap), pipeline, everything)
    rows = (built.good(built.records.where(F.col(ERROR_COLUMN).isNull()))
            .withColumn("_tidemark_batch_id", F.col("_kafka_offset") + 1).cache())
    for lo in range(0, batches, CHUNK):
        chunk = intents[lo:lo + CHUNK]
        last = chunk[-1]
        first_id, last_id = chunk[0].batch_id, last.batch_id

        def append(df: Any, path: str, last: Intent = last) -> None:
            (df.write.format("delta").mode("append").option("txnAppId", pipeline.name)
             .option("txnVersion", last.batch_id).option("userMetadata", last.to_json()).save(path))

        ledger_rows = spark.createDataFrame([i.row() for i in chunk], LEDGER_SCHEMA)
        append(ledger_rows.repartitionByRange(len(chunk), "batch_id"), pipeline.ledger_path)
        part = rows.where(F.col("_tidemark_batch_id").between(first_id, last_id))
        append(part.repartitionByRange(len(chunk), "_tidemark_batch_id"), pipeline.target)
        append(built.bad(built.records).limit(0), pipeline.quarantine_path)
    rows.unpersist()


def first_commit_seconds(spark: Any, config: Any, pipeline: Any, bootstrap: str) -> float:
    """One new batch by a fresh job, as a restarted run does it."""
    from pipelines.ingest import IngestJob

    job = IngestJob(spark, config, pipeline, bootstrap)
    bounds = job.snapshot()
    t0 = time.perf_counter()
    replay, result = job.protocol.run_batch(bounds, job._new_partition_starts, 1)
    elapsed = time.perf_counter() - t0
    if replay is not None or result is None or result.rows != 1:
        raise AssertionError(f"expected one fresh batch of one row, got replay={replay} result={result}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,2000", help="history sizes in batches, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.spark import build_session
    from tidemark.config import parse_config
    from tidemark.settings import load_settings

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-startup-bench-"))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _):
            spark = build_session(load_settings(), "tidemark-startup-bench", warehouse=work / "warehouse")
            try:
                admin = AdminClient({"bootstrap.servers": bootstrap})
                setups = {}
                for n in sizes:
                    topic = f"startup-{n}-{uuid.uuid4().hex[:6]}"
                    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
                    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
                    for i in range(n + args.reps + 1):
                        producer.produce(topic, value=f'{{"id": {i}, "note": "r{i}"}}'.encode())
                    producer.flush(30)
                    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
                        {"name": "startup", "topics": [topic], "target": str(work / f"t{n}"),
                         "schema": "id BIGINT, note STRING"}]})
                    t0 = time.perf_counter()
                    make_history(spark, config, config.pipelines[0], bootstrap, n)
                    print(f"history of {n} batches made in {time.perf_counter() - t0:.0f}s", flush=True)
                    setups[n] = config
                first_commit_seconds(spark, setups[sizes[0]], setups[sizes[0]].pipelines[0], bootstrap)  # warm-up
                for rep in range(args.reps):
                    for n in (sizes if rep % 2 == 0 else list(reversed(sizes))):
                        secs = first_commit_seconds(spark, setups[n], setups[n].pipelines[0], bootstrap)
                        times[n].append(secs)
                        print(f"rep {rep + 1}: history {n}: first commit in {secs:.2f}s", flush=True)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {n: statistics.median(t) for n, t in times.items()}
    lines = ["", *header("Start-up cost vs history (R2)", load_before), "",
             "| batches of history | median s to first commit | all runs (s) |", "|---:|---:|---|"]
    lines += [f"| {n:,} | {med[n]:.2f} | {', '.join(f'{t:.2f}' for t in times[n])} |" for n in sizes]
    lines += ["", (f"**Ratio {sizes[-1]:,} / {sizes[0]:,} batches = {med[sizes[-1]] / med[sizes[0]]:.2f}×** "
              "(1.0× means start-up does not grow with history).")]
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
