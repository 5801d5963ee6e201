"""What a batch's Kafka read leaves in the driver's heap, per partition fetch size and record size.

Spark pools a read's consumers by group id and partition for the next read, and a pooled
consumer keeps its last fetch response and its last poll's records until it has been idle
for 5 minutes. So every topic-partition a driver has read holds some heap between batches,
and how much depends on ``max.partition.fetch.bytes`` (``pipelines.transform.BULK_READ_OPTIONS``).

One process, one broker. For each record size a topic of ``--partitions`` partitions of
about ``--partition-mb`` MB each is written. The session evicts consumers idle for 5 s
(Spark's default is 5 minutes), so every measurement starts from an empty pool: a read
of one record a partition first (what a session's first read creates once is not
counted), then, for each fetch size and record size, alternating over ``--reps``
rounds: wait for the pool to empty, the heap after a full collection, the whole topic
read through ``pipelines.transform.read_ranges`` and counted, the heap after a full
collection again (within a second of the read, long before its consumers are evicted).
Reported: MiB left reachable (medians), and the read's seconds on the 1 KB records.

    .venv/bin/python -m bench.diagnostics.read_heap_bench --json read_heap.json --png read_heap.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments

#: Seconds after which the session's pools have evicted the last read's idle consumers (5 s idle, checked each second).
EVICTED_AFTER_S = 7.0


def _topic(admin: Any, partitions: int) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"bench-heap-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _fill(producer: Any, topic: str, partitions: int, records: int, value: bytes) -> None:
    for p in range(partitions):
        for i in range(records):
            producer.produce(topic, value=value, partition=p)
            if i % 20_000 == 19_999:
                producer.flush(60)
        producer.flush(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--partition-mb", type=int, default=24, help="about this many MB of values per partition")
    parser.add_argument("--value-bytes", default="1000,10000,200", help="record sizes, comma-separated")
    parser.add_argument("--fetch-mib", default="32,8,4,1", help="max.partition.fetch.bytes values in MiB")
    parser.add_argument("--reps", type=int, default=3, help="rounds, fetch sizes alternating")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    report_arguments(parser)
    args = parser.parse_args(argv)
    sizes = [int(v) for v in args.value_bytes.split(",")]
    records = {size: args.partition_mb * 1_000_000 // size for size in sizes}  # per partition
    fetches = [int(v) for v in args.fetch_mib.split(",")]

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from connectors.kafka_config import spark_options
    from infra.spark import build_session, reachable_heap
    from offsets.ledger import Intent, Range, now_utc
    from pipelines.transform import BULK_READ_OPTIONS, read_ranges
    from tidemark.config import KafkaConnection
    from tidemark.settings import load_settings

    load_before = loadavg()
    settings = load_settings()
    kept: dict[str, dict[str, list[float]]] = {str(f): {str(s): [] for s in sizes} for f in fetches}
    seconds: dict[str, list[float]] = {str(f): [] for f in fetches}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                             "queue.buffering.max.kbytes": 1_048_576})
        topics = {}
        for size in sizes:
            topics[size] = _topic(admin, args.partitions)
            _fill(producer, topics[size], args.partitions, records[size], b"x" * size)
        # Idle consumers and fetched data go after 5 s, so that each measurement starts from an empty pool.
        evict = {f"spark.kafka.consumer.{pool}.{key}": value for pool in ("cache", "fetchedData.cache")
                 for key, value in (("timeout", "5s"), ("evictorThreadRunInterval", "1s"))}
        spark = build_session(settings, "tidemark-read-heap-bench", warehouse=Path(tempfile.mkdtemp()) / "wh",
                              extra=evict)
        try:
            connection = spark_options(KafkaConnection(bootstrap_servers=bootstrap), bootstrap)
            warm = _topic(admin, args.partitions)
            _fill(producer, warm, args.partitions, 1, b"x")
            ranges = tuple(Range(warm, p, 0, 1) for p in range(args.partitions))
            read_ranges(spark, connection, Intent("heap", 1, "w", now_utc(), ranges)).count()
            for rep in range(args.reps):
                for fetch in (fetches if rep % 2 == 0 else list(reversed(fetches))):
                    options = {**connection, "kafka.max.partition.fetch.bytes": str(fetch << 20),
                               "kafka.fetch.max.bytes": str(max(fetch << 20, int(BULK_READ_OPTIONS["kafka.fetch.max.bytes"])))}
                    for size in sizes:
                        time.sleep(EVICTED_AFTER_S)
                        before = reachable_heap(spark)
                        ranges = tuple(Range(topics[size], p, 0, records[size]) for p in range(args.partitions))
                        started = time.perf_counter()
                        count = read_ranges(spark, options, Intent("heap", 1, "w", now_utc(), ranges)).count()
                        elapsed = time.perf_counter() - started
                        if count != records[size] * args.partitions:
                            raise AssertionError(f"read {count} records, expected {records[size] * args.partitions}")
                        left = (reachable_heap(spark) - before) / 2**20
                        kept[str(fetch)][str(size)].append(left)
                        if size == 1000:
                            seconds[str(fetch)].append(elapsed)
                        print(f"rep {rep + 1} fetch {fetch} MiB, {size} B records: {left:.0f} MiB left reachable, "
                              f"read {elapsed:.2f}s", flush=True)
        finally:
            spark.stop()
            del producer, admin  # librdkafka clients outliving the broker log connection errors

    med = {f: {s: statistics.median(v) for s, v in by.items()} for f, by in kept.items()}
    lines = ["", *header("What a batch's Kafka read leaves in the driver's heap", load_before),
             (f"Kafka {broker_version}; {args.partitions} partitions of about {args.partition_mb} MB each; "
              f"medians of {args.reps}; other read settings as `BULK_READ_OPTIONS`."), "",
             "| `max.partition.fetch.bytes` | " + " | ".join(f"{s} B records, MiB left" for s in sizes)
             + " | read of the 1 KB records, s |",
             "|---|" + "---:|" * (len(sizes) + 1)]
    for fetch in fetches:
        read_s = f"{statistics.median(seconds[str(fetch)]):.2f}" if seconds[str(fetch)] else "-"
        lines.append(f"| {fetch} MiB | " + " | ".join(f"{med[str(fetch)][str(s)]:.0f}" for s in sizes)
                     + f" | {read_s} |")
    emit(lines, args.output)
    emit_json({"benchmark": "read_heap_bench", "partitions": args.partitions, "partition_mb": args.partition_mb,
               "reps": args.reps, "kept_mib": kept, "median_kept_mib": med, "read_seconds_1kb": seconds,
               "median_read_seconds_1kb": {f: statistics.median(v) for f, v in seconds.items() if v}},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
