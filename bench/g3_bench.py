"""What G3 (whole source transactions) and dedup cost, side by side on the same relay-style data.

``--records`` events are written the way the relay writes them: source transactions of
1-8 events spread over 3 topics x 3 partitions, one Kafka transaction each, with the
``tidemark.*`` headers and an ``id`` header. Three pipeline settings then load all of it
into fresh tables from one SparkSession, order alternating over ``--reps``:

* ``plain``: ``transactions.atomic: false``, no dedup (the rows, offsets and guarantees
  G1/G2/G7 only);
* ``g3``: the default (``transactions.scan: auto``): the first batch is written guarded,
  meets a multi-event transaction, and is revised with the planning scan and the cut;
* ``g3-scan``: ``transactions.scan: always``: scanned and cut from the start;
* ``g3+dedup``: also ``dedup: {}`` (window lookup in the table, copies within the batch).

Each run is checked: every event once, every transaction whole. Reported: medians and
the ratios to ``plain``.

    .venv/bin/python -m bench.g3_bench                         # 200,000 events, 2 reps
    .venv/bin/python -m bench.g3_bench --records 20000 --reps 1
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import emit, header, kafka_broker, loadavg

SCHEMA = "order_id STRING, amount DOUBLE, note STRING"
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {"transactions": {"atomic": False}},
    "g3": {},
    "g3-scan": {"transactions": {"scan": "always"}},
    "g3+dedup": {"dedup": {}},
}


def produce(bootstrap: str, topics: list[str], records: int, *, value_bytes: int, seed: int) -> int:
    """Relay-style source transactions; returns how many transactions were written."""
    from confluent_kafka import Producer

    from outbox import headers as H

    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"g3bench-{uuid.uuid4().hex[:8]}",
                         "enable.idempotence": True, "linger.ms": 5, "queue.buffering.max.kbytes": 1_048_576})
    producer.init_transactions(30)
    written = txns = 0
    # Many source transactions per Kafka transaction, to write fast (the relay makes one each);
    # the ingest's cut reads only the headers, never the Kafka transaction boundaries.
    per_commit = 200
    pending = 0
    producer.begin_transaction()
    while written < records:
        size = min(rng.randint(1, 8), records - written)
        placement = [(rng.choice(topics), rng.randrange(3)) for _ in range(size)]
        counts: dict[str, int] = {}
        for t, _ in placement:
            counts[t] = counts.get(t, 0) + 1
        txns += 1
        lsn = f"0/{txns:X}"
        for position, (topic, partition) in enumerate(placement):
            body = {"order_id": f"o-{written}", "amount": round(rng.uniform(1, 500), 2), "note": ""}
            body["note"] = "x" * max(0, value_bytes - len(json.dumps(body)))
            producer.produce(topic, value=json.dumps(body).encode(), key=f"k{rng.randrange(100)}".encode(),
                             partition=partition, headers=[
                                 (H.EVENT_ID, f"e-{written}"), (H.TXID, str(txns)), (H.LSN, lsn),
                                 (H.POSITION, str(position)), (H.SIZE, str(size)),
                                 (H.TOPIC_COUNTS, json.dumps(dict(sorted(counts.items())), separators=(",", ":")))])
            written += 1
        pending += 1
        if pending == per_commit:
            producer.commit_transaction(60)
            producer.begin_transaction()
            pending = 0
    producer.commit_transaction(60)
    return txns


def run(spark: Any, bootstrap: str, topics: list[str], target: Path, settings: dict[str, Any]) -> tuple[int, int]:
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "bench", "topics": topics, "target": str(target), "schema": SCHEMA, **settings}]})
    report = IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
    return report.rows, len(report.batches)


def verify(spark: Any, target: Path, expected: int) -> None:
    df = spark.read.format("delta").load(str(target))
    n, ids = df.selectExpr("count(*)", "count(DISTINCT _tidemark_event_id)").first()  # type: ignore[misc]
    if not n == ids == expected:
        raise AssertionError(f"{target.name}: {n} rows, {ids} distinct event ids; expected {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--output", help="also write the markdown report to this file")
    args = parser.parse_args(argv)

    from infra.spark import build_session
    from tidemark.settings import load_settings

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-g3-bench-"))
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    batches: dict[str, list[int]] = {name: [] for name in SETTINGS}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _):
            from confluent_kafka.admin import AdminClient, NewTopic

            run_id = uuid.uuid4().hex[:6]
            topics = [f"bench-g3-{run_id}-{t}" for t in ("order", "payment", "shipment")]
            admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the futures
            for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
                future.result(30)
            txns = produce(bootstrap, topics, args.records, value_bytes=args.value_bytes, seed=7)
            print(f"produced {args.records:,} events in {txns:,} source transactions", flush=True)
            spark = build_session(load_settings(), "tidemark-g3-bench", warehouse=work / "warehouse")
            try:
                run(spark, bootstrap, topics, work / "warmup", SETTINGS["plain"])  # JVM, page cache
                for rep in range(args.reps):
                    order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
                    for name in order:
                        target = work / f"{name}-{rep}"
                        t0 = time.perf_counter()
                        rows, n = run(spark, bootstrap, topics, target, SETTINGS[name])
                        elapsed = time.perf_counter() - t0
                        verify(spark, target, args.records)
                        times[name].append(elapsed)
                        batches[name].append(n)
                        print(f"rep {rep + 1} {name}: {elapsed:.1f}s, {rows:,} rows, {n} batch(es)", flush=True)
                        shutil.rmtree(target, ignore_errors=True)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(t) for name, t in times.items()}
    lines = ["", *header("G3 and dedup cost", load_before),
             (f"Data: {args.records:,} events of ~{args.value_bytes} B in {txns:,} source transactions of 1-8 events "
              "over 3 topics x 3 partitions, relay headers; each run into a fresh table, verified."), "",
             "| setting | median s | events/s | batches | all runs (s) | time vs plain |",
             "|---|---:|---:|---:|---|---:|"]
    for name in SETTINGS:
        lines.append(f"| {name} | {med[name]:.1f} | {args.records / med[name]:,.0f} | "
                     f"{statistics.median(batches[name]):.0f} | {', '.join(f'{t:.1f}' for t in times[name])} | "
                     f"{med[name] / med['plain']:.2f}× |")
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
