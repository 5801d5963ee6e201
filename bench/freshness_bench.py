"""Freshness: from an application's database commit to the row visible in Delta, at a steady rate.

An application commits ``--rate`` events/s (transactions of 10 events over 3 aggregate
types) into an outbox; ``tidemark relay run`` relays them (group commit). Two ingest
contenders read the relay's topics in turn, each for ``--seconds`` after a warm-up, in
one run on the same stack:

* ``tidemark``: ``tidemark ingest --follow`` with a 1 s trigger (G3 from the manifest, the
  defaults otherwise);
* ``structured-streaming``: Spark's Kafka source (read_committed) into Delta with a 1 s
  processing-time trigger, the peer a Spark user would write.

A separate reader (no Spark) watches each table's ``_delta_log`` for new commits; when one
appears it reads the event ids that commit added (the Parquet files it names) and takes,
for each, the time since its database commit returned. Reported: p50/p95/p99 seconds per
contender, for the warm-up (``first``: from the contender's first commit to the window, what a
just-started follower gives) and the measured window (``steady``), and the window's p99 in four
equal parts (how far the steady figure moves) (``--json FILE``, ``--svg FILE``).

    .venv/bin/python -m bench.freshness_bench                     # 2,000 events/s, 120 s each
    .venv/bin/python -m bench.freshness_bench --rate 500 --seconds 30 --warmup 15
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import bars_svg, emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.relay_bench import postgres

AGGREGATES = ("order", "payment", "shipment")
SCHEMA = "seq BIGINT, note STRING"


class Writer(threading.Thread):
    """Commits transactions of 10 events at a steady rate; remembers when each event's commit returned."""

    def __init__(self, dsn: str, table: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.rate = dsn, table, rate
        self.committed: dict[str, float] = {}
        self.stop = threading.Event()
        self.behind = 0.0

    def run(self) -> None:
        import psycopg2
        from psycopg2.extras import execute_values

        from outbox.schema import TableName

        name = TableName.parse(self.table).sql
        conn = psycopg2.connect(self.dsn)
        started, seq = time.monotonic(), 0
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    due = started + seq / self.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        self.behind = max(self.behind, -wait)
                    ids = [str(uuid.uuid4()) for _ in range(10)]
                    execute_values(cur, f"INSERT INTO {name} (id, aggregatetype, aggregateid, type, payload) VALUES %s",
                                   [(i, AGGREGATES[(seq + n) % 3], f"k{(seq + n) % 50}", "Changed",
                                     json.dumps({"seq": seq + n, "note": "x" * 150})) for n, i in enumerate(ids)],
                                   template="(%s, %s, %s, %s, %s::jsonb)")
                    conn.commit()
                    now = time.time()
                    for i in ids:
                        self.committed[i] = now
                    seq += 10
        finally:
            conn.close()


class Watcher(threading.Thread):
    """Notices each new Delta commit of ``table`` and the event ids it added, with the time it was seen."""

    def __init__(self, table: Path, id_column: str) -> None:
        super().__init__(daemon=True)
        self.table, self.id_column = table, id_column
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import pyarrow.parquet as pq

        log = self.table / "_delta_log"
        version = 0
        while not self.stop.is_set():
            path = log / f"{version:020d}.json"
            if not path.exists():
                time.sleep(0.05)
                continue
            now = time.time()
            for line in path.read_text().splitlines():
                add = json.loads(line).get("add")
                if add:
                    for event in pq.read_table(self.table / add["path"], columns=[self.id_column]).column(0).to_pylist():
                        if event is not None:
                            self.seen.setdefault(event, now)
            version += 1


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1], "events": float(len(ordered))}


def spark_streaming_child(bootstrap: str, topics: str, target: str, checkpoint: str) -> None:
    """The peer: Structured Streaming, Kafka (read_committed) -> Delta, 1 s trigger, until SIGTERM."""
    from pyspark.sql import functions as F

    from infra.spark import build_session
    from tidemark.settings import load_settings

    spark = build_session(load_settings(), "freshness-structured-streaming")
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topics).option("startingOffsets", "latest")
           .option("kafka.isolation.level", "read_committed").option("includeHeaders", "true")
           .option("failOnDataLoss", "true").load())
    rows = raw.select(
        F.from_json(F.col("value").cast("string"), SCHEMA).alias("v"), "topic", "partition", "offset",
        F.expr("cast(filter(headers, h -> h.key = 'id')[0].value as string)").alias("event_id"))
    query = (rows.select("v.*", "topic", "partition", "offset", "event_id").writeStream.format("delta")
             .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start(target))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set() and query.isActive:
        stop.wait(0.5)
    query.stop()
    spark.stop()


def measure(name: str, start: Any, table: Path, id_column: str, dsn: str, outbox: str, rate: int,
            warmup: float, seconds: float, slices: int = 4) -> dict[str, Any]:
    """Run one contender: start it, let it warm up under load, then measure ``seconds`` of commits.

    Returned: the percentiles of the window (``steady``), of the warm-up from the contender's
    first commit to the window (``first``: what a just-started follower gives), and of each of
    ``slices`` equal parts of the window (``slices``: how much the steady figure moves).
    """
    proc = start()
    writer = Writer(dsn, outbox, rate)
    watcher = Watcher(table, id_column)
    try:
        # The load starts with the contender: a follower starting at `latest` creates its
        # table with its first non-empty batch. Events before that are not measured.
        watcher.start()
        writer.start()
        deadline = time.monotonic() + 300
        while not (table / "_delta_log" / f"{0:020d}.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start (exit {proc.poll()})")
            time.sleep(0.5)
        ready = time.time()
        time.sleep(warmup)
        window_start = time.time()
        time.sleep(seconds)
        window_end = time.time()
        writer.stop.set()
        writer.join(30)
        deadline = time.monotonic() + 120
        first = [i for i, t in writer.committed.items() if ready <= t < window_start]
        measured = [i for i, t in writer.committed.items() if window_start <= t < window_end]
        while time.monotonic() < deadline and not all(i in watcher.seen for i in first + measured):
            time.sleep(0.5)
        missing = [i for i in first + measured if i not in watcher.seen]
        if missing:
            raise AssertionError(f"{name}: {len(missing)} of {len(first) + len(measured)} events never became visible")
        print(f"{name}: {len(first):,} events in the warm-up, {len(measured):,} measured; writer fell behind its "
              f"rate by at most {writer.behind:.2f}s", flush=True)

        def latency(ids: list[str]) -> dict[str, float]:
            return percentiles([watcher.seen[i] - writer.committed[i] for i in ids])

        width = (window_end - window_start) / slices
        parts = [[i for i in measured if window_start + k * width <= writer.committed[i] < window_start + (k + 1) * width]
                 for k in range(slices)]
        return {"steady": latency(measured), "first": latency(first), "first_seconds": window_start - ready,
                "slices": [latency(ids) for ids in parts if ids], "writer_behind_s": writer.behind}
    finally:
        writer.stop.set()
        watcher.stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=2000, help="events per second the application commits")
    parser.add_argument("--seconds", type=float, default=120, help="measured window per contender")
    parser.add_argument("--warmup", type=float, default=30, help="load before the window opens")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--dsn", help="use this PostgreSQL instead of a fresh embedded server")
    report_arguments(parser)
    parser.add_argument("--svg", help="write a bar chart of p99 seconds to this SVG file")
    parser.add_argument("--only", choices=["tidemark", "structured-streaming"],
                        help="measure one contender (to study it; a comparison needs both in one run)")
    parser.add_argument("--structured-streaming-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.structured_streaming_child:
        spark_streaming_child(*args.structured_streaming_child)
        return 0

    import yaml

    from outbox.schema import TableName, init_outbox
    from tidemark.config import RelayConfig

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-freshness-"))
    print(f"logs in {work}", flush=True)
    run = uuid.uuid4().hex[:6]
    results: dict[str, dict[str, float]] = {}  # the steady window's percentiles
    first: dict[str, dict[str, float]] = {}  # the warm-up's: from the contender's first commit to the window
    slices: dict[str, list[dict[str, float]]] = {}  # the window in four equal parts
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version), postgres(args.dsn) as dsn:
        relay = RelayConfig(id=f"fresh-{run}", table=f"public.outbox_{run}", topic=f"fresh-{run}.{{aggregatetype}}",
                            offsets_topic=f"fresh-{run}.offsets", manifest_topic=f"fresh-{run}.manifest",
                            topic_partitions=3)
        init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                    slot=relay.slot_name)
        topics = [relay.topic_for(a) for a in AGGREGATES]
        config = work / "tidemark.yaml"
        config.write_text(yaml.safe_dump({
            "kafka": {"bootstrap_servers": bootstrap}, "postgres": {"dsn": dsn},
            "relay": json.loads(relay.model_dump_json(exclude_none=True)),
            "pipelines": [{"name": "fresh", "topics": topics, "target": str(work / "tidemark"), "schema": SCHEMA,
                           "start": "latest", "trigger_interval_seconds": 1,
                           "transactions": {"manifest_topic": relay.manifest_topic}}]}))
        cli = [sys.executable, "-m", "tidemark.cli"]
        logs = {n: open(work / f"{n}.log", "wb") for n in ("relay", "tidemark", "structured-streaming")}  # noqa: SIM115
        relay_proc = subprocess.Popen([*cli, "relay", "run", "--config", str(config)], stdout=logs["relay"],
                                      stderr=logs["relay"], env=env, start_new_session=True)
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": bootstrap})
            for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
                future.result(30)
            contenders = {
                "tidemark": (lambda: subprocess.Popen([*cli, "-v", "ingest", "fresh", "--follow", "--config", str(config)],
                                                      stdout=logs["tidemark"], stderr=logs["tidemark"], env=env,
                                                      start_new_session=True), work / "tidemark", "_tidemark_event_id"),
                "structured-streaming": (lambda: subprocess.Popen(
                    [sys.executable, "-m", "bench.freshness_bench", "--structured-streaming-child", bootstrap,
                     ",".join(topics), str(work / "ss"), str(work / "ss-checkpoint")],
                    stdout=logs["structured-streaming"], stderr=logs["structured-streaming"], env=env,
                    start_new_session=True), work / "ss", "event_id"),
            }
            for name, (start, table, column) in contenders.items():
                if args.only and name != args.only:
                    continue
                measured = measure(name, start, table, column, dsn, relay.table, args.rate, args.warmup, args.seconds)
                results[name], first[name], slices[name] = measured["steady"], measured["first"], measured["slices"]
                print(f"{name}: first {first[name]}; steady {results[name]}", flush=True)
        finally:
            relay_proc.send_signal(signal.SIGTERM)
            relay_proc.wait(120)
            for f in logs.values():
                f.close()

    lines = ["", *header("Freshness: database commit to row visible in Delta", load_before),
             (f"Kafka {broker_version}, one broker; PostgreSQL (embedded); {args.rate:,} events/s in transactions of "
              f"10 over 3 topics x 3 partitions, relayed by `tidemark relay run`; each contender {args.seconds:.0f} s "
              f"measured after {args.warmup:.0f} s of warm-up, one after the other; a 1 s trigger for both. "
              f"First: the warm-up, from the contender's first commit; steady: the measured window."), "",
             "| contender | part | p50 s | p95 s | p99 s | max s | events |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        for part, q in (("first", first[name]), ("steady", r)):
            lines.append(f"| {name} | {part} | {q['p50']:.2f} | {q['p95']:.2f} | {q['p99']:.2f} | {q['max']:.2f} | "
                         f"{q['events']:,.0f} |")
    both = len(results) == 2
    slice_ratios = ([t["p99"] / s["p99"] for t, s in zip(slices["tidemark"], slices["structured-streaming"], strict=False)]
                    if both else [])
    if both:
        lines += ["", (f"p99 Tidemark / Structured Streaming: first {first['tidemark']['p99'] / first['structured-streaming']['p99']:.2f}×, "
                       f"steady {results['tidemark']['p99'] / results['structured-streaming']['p99']:.2f}× "
                       f"(the window's quarters: {', '.join(f'{r:.2f}×' for r in slice_ratios)})")]
    emit(lines, args.output)
    emit_json({"benchmark": "freshness_bench", "rate": args.rate, "seconds": args.seconds, "warmup": args.warmup,
               "contenders": results, "first": first, "slices": slices, "load_after": loadavg(),
               "p99_ratio_tidemark_vs_structured_streaming":
                   results["tidemark"]["p99"] / results["structured-streaming"]["p99"] if both else None,
               "first_p99_ratio_tidemark_vs_structured_streaming":
                   first["tidemark"]["p99"] / first["structured-streaming"]["p99"] if both else None,
               "slice_p99_ratios": slice_ratios},
              args.json, png=args.png)
    if args.svg:
        bars_svg(args.svg, f"Freshness p99 at {args.rate:,} events/s (commit to visible in Delta)",
                 {name: r["p99"] for name, r in results.items()}, "s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
