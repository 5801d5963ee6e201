"""The relay's exactly-once throughput vs the same relay without transactions (the ceiling).

A fresh outbox gets ``--events`` events of ~250 B (3 topics) in source transactions of
each size in ``--txn-sizes``, committed before any contender starts; two replication
slots see them all. Then, in alternating order:

* ``relay``: :class:`outbox.relay.Relay` as shipped (group commit, manifest, position,
  acknowledgements and row deletes), timed at its steady rate from its first committed
  group to its last (start-up excluded).
* ``nontxn-relay``: the same capture, decode and messages from the other slot, produced
  by a plain idempotent producer (``acks=all``, no transactions, no manifest, no
  position), flushed where the relay would close a group (linger, events, idle), then
  acknowledged (deletes and slot confirmation): at-least-once. The ceiling the issue
  sets: what exactly-once costs on top of the same relay. Its deletes go to a twin of
  the outbox with the same rows and indexes, written in the same transactions
  (``<table>_twin``): deleting from the relay's table would find the rows gone
  whenever the relay ran first.
* ``plain-producer``: the same messages read from a copy of the rows in one query,
  produced with nothing else: the machine's and broker's ceiling.

Reported per transaction size: events/s of each (medians) and relay / nontxn-relay, and the
CPU seconds the benchmark's process spent on each run (Python threads and librdkafka's);
``--json FILE`` writes them (``ratio_vs_nontxn_relay``), ``--svg FILE`` a bar chart.

    .venv/bin/python -m bench.relay_bench                          # 200,000 events; 10, 1, 100; 2 reps
    .venv/bin/python -m bench.relay_bench --events 20000 --txn-sizes 10 --reps 1
"""

from __future__ import annotations

import argparse
import shutil
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

from bench.common import bars_svg, emit, emit_json, header, kafka_broker, loadavg, report_arguments

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

    state = Path(tempfile.mkdtemp(prefix="tidemark-bench-pg-"))
    server = EmbeddedPostgres(state, port=free_port_block(1, start=23432))
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)  # ~0.7 GB of WAL and slots a run


def fill(dsn: str, table: str, events: int, txn_size: int) -> None:
    """``events`` outbox rows in committed transactions of ``txn_size``, a copy of them, and the twin's table."""
    import psycopg2
    from psycopg2.extras import execute_values

    from outbox.schema import TableName

    name = TableName.parse(table).sql
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table}_twin (LIKE {name} INCLUDING ALL)")
            conn.commit()
            for t in range(0, events, txn_size):
                rows = [(str(uuid.uuid4()), AGGREGATES[i % 3], f"agg-{i % 100}", "Changed",
                         f'{{"seq": {i}, "note": "{"x" * 200}"}}') for i in range(t, min(t + txn_size, events))]
                # The twin's rows come in the same transactions, so both deletes meet the same
                # table history: rows copied in one transaction were 13 % cheaper to delete.
                for target in (name, f"{table}_twin"):
                    execute_values(cur, f"INSERT INTO {target} (id, aggregatetype, aggregateid, type, payload) "
                                   "VALUES %s", rows, template="(%s, %s, %s, %s, %s::jsonb)")
                conn.commit()
            cur.execute(f"CREATE TABLE {table}_copy AS SELECT * FROM {name}")
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            # Neither contender pays for the fill: not its dirty pages, nor autovacuum's first pass
            # over the new tables, which otherwise lands on whichever contender runs first.
            for target in (name, f"{table}_twin", f"{table}_copy"):
                cur.execute(f"VACUUM ANALYZE {target}")
            cur.execute("CHECKPOINT")
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
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    job.run(stop, idle_exit=30)
    stop.set()
    watcher.join()
    if job.report.events != events or not done:
        raise AssertionError(f"relay relayed {job.report.events} of {events} events")
    return done[0]


def run_nontxn(dsn: str, client: dict[str, str], relay: Any, slot: str, events: int) -> float:
    """Seconds per ``events`` for the same relay without transactions, at its steady rate (as :func:`run_relay`)."""
    from outbox.grouping import collector_for_groups

    with collector_for_groups():  # the relay's collector settings (a no-op here: it holds nothing)
        return _run_nontxn(dsn, client, relay, slot, events)


def _run_nontxn(dsn: str, client: dict[str, str], relay: Any, slot: str, events: int) -> float:
    import psycopg2
    from confluent_kafka import Producer

    from outbox.capture import Capture
    from outbox.relay import Relay
    from outbox.schema import TableName

    job = Relay(relay, dsn=dsn, client_config=client)  # its topic routing and message building
    producer = Producer({**client, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    capture = Capture(dsn, slot=slot, publication=relay.publication_name, table=TableName.parse(relay.table),
                      max_events=relay.max_transaction_events, max_bytes=int(relay.max_transaction_bytes))
    capture.connect()
    capture.start()
    db = psycopg2.connect(dsn)
    db.autocommit = True
    done, first, pending, unflushed, lsn = 0, None, [], 0, 0
    opened = idle_since = time.monotonic()
    linger = relay.group.linger_ms / 1000
    try:
        while done < events and time.monotonic() - idle_since < 30:
            txn = capture.next_transaction(timeout=max(0.0, opened + linger - time.monotonic()) if unflushed else 0.5)
            if txn is not None:
                idle_since = time.monotonic()
                if not unflushed:
                    opened = time.monotonic()
                for topic, key, value, headers in job.staging.messages(txn, job.admission.routed(txn)):
                    while True:
                        try:
                            producer.produce(topic, value, key, headers=headers)
                            break
                        except BufferError:
                            producer.poll(0.05)
                producer.poll(0)
                pending += [e.id.decode() for e in txn.events]
                lsn, unflushed, done = txn.end_lsn, unflushed + len(txn.events), done + len(txn.events)
            # The relay's cadence: flush (then acknowledge) when a group would close.
            if unflushed and (txn is None or unflushed >= relay.group.max_events or done >= events
                              or time.monotonic() - opened >= linger):
                if producer.flush(60) != 0:  # at-least-once: delivered before acknowledged
                    raise AssertionError("nontxn relay: messages not delivered")
                with db.cursor() as cur:
                    cur.execute(f"DELETE FROM {TableName.parse(relay.table + '_twin').sql} "
                                "WHERE id = ANY(%s::uuid[])", (pending,))
                capture.confirm(lsn)
                pending, unflushed = [], 0
                if first is None:
                    first = (time.perf_counter(), done)
    finally:
        capture.close()
        db.close()
    if done != events or first is None:
        raise AssertionError(f"nontxn relay relayed {done} of {events} events")
    rate = (events - first[1]) / (time.perf_counter() - first[0])
    return events / rate


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
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--txn-sizes", default="10,1,100", help="events per source transaction, comma-separated")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--dsn", help="use this PostgreSQL instead of a fresh embedded server")
    report_arguments(parser)
    parser.add_argument("--svg", help="write a bar chart of events/s to this SVG file")
    args = parser.parse_args(argv)

    import psycopg2

    from outbox.schema import TableName, init_outbox
    from tidemark.config import RelayConfig

    load_before = loadavg()
    sizes = [int(x) for x in args.txn_sizes.split(",")]
    contenders = ("relay", "nontxn-relay", "plain-producer")
    times: dict[tuple[int, str], list[float]] = {}
    cpus: dict[tuple[int, str], list[float]] = {}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version), postgres(args.dsn) as dsn:
        client = {"bootstrap.servers": bootstrap}
        for size in sizes:
            for rep in range(args.reps):
                run = uuid.uuid4().hex[:8]
                relay = RelayConfig(id=f"bench-{run}", table=f"public.outbox_{run}",
                                    topic=f"bench.{run}.{{aggregatetype}}", offsets_topic=f"bench.{run}.offsets",
                                    manifest_topic=f"bench.{run}.manifest", ack_every=50)
                init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                            slot=relay.slot_name)
                other_slot = f"{relay.slot_name}_nontxn"
                with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                    cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (other_slot,))
                create_topics(client, [relay.topic_for(a) for a in AGGREGATES])
                t0 = time.perf_counter()
                fill(dsn, relay.table, args.events, size)
                print(f"txn size {size}, rep {rep + 1}: {args.events:,} events in {args.events // size:,} "
                      f"transactions written in {time.perf_counter() - t0:.0f}s", flush=True)
                order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
                for name in order:
                    cpu = time.process_time()
                    if name == "relay":
                        elapsed = run_relay(dsn, client, relay, args.events)
                    elif name == "nontxn-relay":
                        elapsed = run_nontxn(dsn, client, relay, other_slot, args.events)
                    else:
                        elapsed = run_plain(dsn, client, relay, relay.table, args.events)
                    cpu = time.process_time() - cpu
                    times.setdefault((size, name), []).append(elapsed)
                    cpus.setdefault((size, name), []).append(cpu)
                    print(f"txn size {size}, rep {rep + 1} {name}: {elapsed:.2f}s, "
                          f"{args.events / elapsed:,.0f} events/s, {cpu:.1f} CPU s in this process", flush=True)
                with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (other_slot,))

    rate = {k: args.events / statistics.median(v) for k, v in times.items()}
    lines = ["", *header("Outbox relay: exactly-once vs the same relay without transactions", load_before),
             (f"Kafka {broker_version}, one broker. {args.events:,} events of ~250 B over 3 topics (3 partitions "
              f"each); relay defaults (group commit: linger 100 ms), `ack_every=50`; medians of {args.reps}."),
             "", ("| events per source txn | relay events/s | nontxn-relay events/s | plain-producer events/s "
                  "| relay / nontxn-relay |"), "|---:|---:|---:|---:|---:|"]
    figures: dict[str, Any] = {}
    for size in sizes:
        ratio = rate[(size, "relay")] / rate[(size, "nontxn-relay")]
        lines.append(f"| {size} | {rate[(size, 'relay')]:,.0f} | {rate[(size, 'nontxn-relay')]:,.0f} | "
                     f"{rate[(size, 'plain-producer')]:,.0f} | **{ratio:.2f}×** |")
        figures[str(size)] = {**{f"{n}_events_per_s": rate[(size, n)] for n in contenders},
                              "ratio_vs_nontxn_relay": ratio,
                              "runs_s": {n: times[(size, n)] for n in contenders},
                              "process_cpu_s": {n: cpus[(size, n)] for n in contenders}}
    emit(lines, args.output)
    emit_json({"benchmark": "relay_bench", "events": args.events, "reps": args.reps, "by_txn_size": figures},
              args.json, png=args.png)
    if args.svg:
        bars_svg(args.svg, f"Relay events/s ({args.events:,} events; events per source transaction)",
                 {f"{n} ({size})": rate[(size, n)] for size in sizes for n in contenders}, "ev/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
