"""The relay's exactly-once throughput vs a plain producer of the same messages (the ceiling).

A fresh outbox gets ``--events`` events in transactions of ``--txn-size`` (10), committed
before either contender starts, and a copy of its rows is kept. Then, in alternating
order:

* ``relay``: :class:`outbox.relay.Relay` (logical decoding, one Kafka transaction per
  source transaction with its position, acknowledgements and row deletes); timed at its
  steady rate, from its first relayed transaction to its last (start-up excluded).
* ``plain-producer``: reads the copied rows in one query and produces the same messages
  (same topics, keys, values and event-id/type headers) with a non-transactional
  confluent-kafka producer, ``acks=all``, then flushes. No exactly-once, no order
  between transactions: the ceiling for this machine and broker.

Reported: events/s of each (medians) and relay / ceiling.

    .venv/bin/python -m bench.relay_bench                   # 20,000 events, 2 reps each
    .venv/bin/python -m bench.relay_bench --events 2000 --reps 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import emit, header, kafka_broker, loadavg

AGGREGATES = ("order", "payment", "shipment")


def create_topics(client: dict[str, Any], topics: list[str]) -> None:
    """Both contenders write to existing topics (3 partitions), so neither pays for creating them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(dict(client))
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
        future.result(30)


@contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    from infra.postgres import EmbeddedPostgres
    from infra.process import free_port_block

    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="tidemark-bench-pg-")), port=free_port_block(1, start=35432))
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()


def fill(dsn: str, table: str, events: int, txn_size: int) -> None:
    """``events`` outbox rows in committed transactions of ``txn_size``, and a copy of them."""
    import psycopg2

    from outbox.schema import add_event

    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for t in range(0, events, txn_size):
                for i in range(t, min(t + txn_size, events)):
                    add_event(cur, AGGREGATES[i % 3], f"agg-{i % 100}", "Changed",
                              {"seq": i, "note": "x" * 200}, table=table)
                conn.commit()
            cur.execute(f"CREATE TABLE {table}_copy AS SELECT * FROM {table}")
        conn.commit()
    finally:
        conn.close()


def run_relay(dsn: str, client: dict[str, str], relay: Any, events: int) -> float:
    """Seconds per ``events`` at the relay's steady rate: from its first relayed transaction to its last.

    Start-up (``init_transactions``, reading the position, opening the slot) is excluded;
    it is paid once per daemon start, not per event.
    """
    from outbox.relay import Relay

    job = Relay(relay, dsn=dsn, client_config=client)
    stop = threading.Event()
    done: list[float] = []

    def watch() -> None:
        first: tuple[float, int] | None = None
        while not stop.is_set():
            if first is None and job.report.events:
                first = (time.perf_counter(), job.report.events)
            if job.report.events >= events and first is not None:
                rate = (events - first[1]) / (time.perf_counter() - first[0])
                done.append(events / rate)
                stop.set()
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    job.run(stop, idle_exit=30)
    stop.set()
    watcher.join()
    if job.report.events != events or not done:
        raise AssertionError(f"relay relayed {job.report.events} of {events} events")
    return done[0]


def run_plain(dsn: str, client: dict[str, str], relay: Any, table: str, events: int) -> float:
    import psycopg2
    from confluent_kafka import Producer

    started = time.perf_counter()
    producer = Producer({**client, "acks": "all", "enable.idempotence": False, "linger.ms": 5})
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, aggregatetype, aggregateid, type, payload::text FROM {table}_copy "
                        "ORDER BY created_at")
            for eid, aggregate, key, kind, payload in cur:
                while True:
                    try:
                        producer.produce(relay.topic_for(aggregate), key=key.encode(), value=payload.encode(),
                                         headers=[("id", str(eid).encode()), ("type", kind.encode())])
                        break
                    except BufferError:
                        producer.poll(0.05)
    finally:
        conn.close()
    if producer.flush(120) != 0:
        raise AssertionError("plain producer did not deliver everything")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--txn-size", type=int, default=10)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--dsn", help="use this PostgreSQL instead of a fresh embedded server")
    parser.add_argument("--output", help="also write the markdown report to this file")
    args = parser.parse_args(argv)

    from outbox.schema import TableName, init_outbox
    from tidemark.config import RelayConfig

    load_before = loadavg()
    times: dict[str, list[float]] = {"relay": [], "plain-producer": []}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version), postgres(args.dsn) as dsn:
        client = {"bootstrap.servers": bootstrap}
        for rep in range(args.reps):
            run = uuid.uuid4().hex[:8]
            relay = RelayConfig(id=f"bench-{run}", table=f"public.outbox_{run}", topic=f"bench.{run}.{{aggregatetype}}",
                                offsets_topic=f"bench.{run}.offsets", ack_every=50)
            init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                        slot=relay.slot_name)
            create_topics(client, [relay.topic_for(a) for a in AGGREGATES])
            t0 = time.perf_counter()
            fill(dsn, relay.table, args.events, args.txn_size)
            print(f"rep {rep + 1}: {args.events:,} events in {args.events // args.txn_size:,} transactions "
                  f"written in {time.perf_counter() - t0:.0f}s", flush=True)
            order = ["relay", "plain-producer"] if rep % 2 == 0 else ["plain-producer", "relay"]
            for name in order:
                if name == "relay":
                    elapsed = run_relay(dsn, client, relay, args.events)
                else:
                    elapsed = run_plain(dsn, client, relay, relay.table, args.events)
                times[name].append(elapsed)
                print(f"rep {rep + 1} {name}: {elapsed:.2f}s, {args.events / elapsed:,.0f} events/s", flush=True)

    med = {name: statistics.median(t) for name, t in times.items()}
    lines = [
        "",
        *header("Outbox relay: exactly-once vs a plain producer (ceiling)", load_before),
        (f"Kafka {broker_version}, one broker. {args.events:,} events of ~250 B in transactions of "
         f"{args.txn_size}, 3 topics; relay `ack_every=50`."),
        "",
        "| contender | median s | events/s | all runs (s) |",
        "|---|---:|---:|---|",
    ]
    for name, runs in times.items():
        lines.append(f"| {name} | {med[name]:.2f} | {args.events / med[name]:,.0f} | "
                     f"{', '.join(f'{t:.2f}' for t in runs)} |")
    ratio = med["plain-producer"] / med["relay"]
    lines += ["", f"**Relay throughput / plain-producer throughput = {ratio:.3f}×** (median times)."]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
