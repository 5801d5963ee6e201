"""The relay with ``format: avro`` and ``format: protobuf`` against the same relay with ``format: json``.

One throwaway broker, PostgreSQL and schema registry (the embedded Apicurio Registry). Each
rep creates three outboxes (table, publication, slot), one per contender, and writes the
same ``--events`` events into all three in the same source transactions of ``--txn-size``
events (default 10): ~250 B JSON payloads over 3 topics, each a record that Avro's
``shop.Changed`` schema and its proto3 twin describe field for field. Every contender
relays its own outbox with :class:`outbox.relay.Relay` as shipped, to topics of its own
whose subjects (``<topic>-value``) are registered ahead:

* ``json``: ``format: json`` (the payload's text as the value);
* ``avro``: ``format: avro``, the encoder of :func:`outbox.encoding.encoder_for`;
* ``protobuf``: ``format: protobuf``, the same.

Each is timed at its steady rate as ``bench.relay_bench`` times the relay (from its first
committed group to its last), in an order that rotates over ``--reps``, after an untimed
round of ``--warmup-events`` (on a fresh broker the first round ran at a third of the later
ones' rate), and each run is checked afterwards: its topics, read ``read_committed``, hold
every event exactly once (by the ``id`` header) and nothing else. Reported: events/s
(medians), avro / json and protobuf / json, the noise band (the smallest and largest ratio
of a single rep), value sizes and this process's CPU per event (the relay runs in it).

    .venv/bin/python -m bench.relay_format_bench                               # 100,000 events, 3 reps
    .venv/bin/python -m bench.relay_format_bench --events 20000 --reps 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.relay_bench import AGGREGATES, create_topics, postgres, run_relay

Format = Literal["json", "avro", "protobuf"]
CONTENDERS: tuple[Format, ...] = ("json", "avro", "protobuf")

#: The payloads' record, as an Avro schema and as its proto3 twin (same fields, same order).
AVRO_SCHEMA = {"type": "record", "name": "Changed", "namespace": "shop", "fields": [
    {"name": "key", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "status", "type": "string"},
    {"name": "amount", "type": "double"}, {"name": "currency", "type": "string"}, {"name": "items", "type": "int"},
    {"name": "customer", "type": "string"}, {"name": "note", "type": "string"}]}
PROTO_SCHEMA = """syntax = "proto3";
package shop;
message Changed {
  string key = 1;
  int64 seq = 2;
  string status = 3;
  double amount = 4;
  string currency = 5;
  int32 items = 6;
  string customer = 7;
  string note = 8;
}
"""
STATUSES = ("PLACED", "PAID", "SHIPPED", "DELIVERED")


def payload(i: int) -> str:
    """Event ``i``'s payload: ~250 B of JSON that both schemas describe."""
    return json.dumps({"key": f"agg-{i % 100}", "seq": i, "status": STATUSES[i % 4],
                       "amount": round((i * 37) % 100_000 / 100, 2), "currency": "EUR", "items": i % 7 + 1,
                       "customer": f"customer-{i % 5000:05d}", "note": "x" * 110})


def fill(dsn: str, tables: list[str], events: int, txn_size: int) -> set[str]:
    """The same ``events`` rows into each of ``tables``, in the same committed transactions of ``txn_size``;
    their event ids."""
    import psycopg2
    from psycopg2.extras import execute_values

    from outbox.schema import TableName

    names = [TableName.parse(t).sql for t in tables]
    ids: set[str] = set()
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for t in range(0, events, txn_size):
                rows = [(str(uuid.uuid4()), AGGREGATES[i % 3], f"agg-{i % 100}", "Changed", payload(i))
                        for i in range(t, min(t + txn_size, events))]
                ids.update(r[0] for r in rows)
                for name in names:  # one source transaction writes all three: each outbox sees the same history
                    execute_values(cur, f"INSERT INTO {name} (id, aggregatetype, aggregateid, type, payload) "
                                   "VALUES %s", rows, template="(%s, %s, %s, %s, %s::jsonb)")
                conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:  # no contender pays for the fill's dirty pages or autovacuum's first pass
            for name in names:
                cur.execute(f"VACUUM ANALYZE {name}")
            cur.execute("CHECKPOINT")
    finally:
        conn.close()
    return ids


@contextmanager
def relay_encoding(encoder: Any) -> Iterator[None]:
    """While open, the :class:`~outbox.relay.Relay` that ``bench.relay_bench.run_relay`` builds gets
    ``encoder`` (as ``tidemark relay run`` passes it), so every contender is timed by the same code."""
    import outbox.relay

    shipped = outbox.relay.Relay

    class Encoding(shipped):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, encoder=encoder, **kwargs)

    outbox.relay.Relay = Encoding  # type: ignore[misc]
    try:
        yield
    finally:
        outbox.relay.Relay = shipped  # type: ignore[misc]


def register(url: str, topics: list[str], fmt: str) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    schema = Schema(json.dumps(AVRO_SCHEMA), "AVRO") if fmt == "avro" else Schema(PROTO_SCHEMA, "PROTOBUF")
    for topic in topics:
        client.register_schema(f"{topic}-value", schema)


def check_exactly_once(bootstrap: str, topics: list[str], ids: set[str], fmt: str) -> float:
    """Every event of ``ids`` once in ``topics`` (read_committed), nothing else, values framed unless
    JSON; the mean value size in bytes."""
    from connectors.topic_reader import read_to_end
    from outbox import wire

    seen: list[str] = []
    size = 0
    for topic in topics:
        for record in read_to_end(bootstrap, topic, timeout=300):
            seen.append(next(v.decode() for k, v in record.headers if k == wire.EVENT_ID))
            value = record.value or b""
            size += len(value)
            if fmt != "json" and value[:1] != b"\0":
                raise AssertionError(f"{fmt}: {topic}:{record.partition}@{record.offset} is not in Confluent's "
                                     f"framing: {value[:8].hex()}")
    if len(seen) != len(ids) or set(seen) != ids:
        raise AssertionError(f"{fmt}: {len(seen):,} records, {len(set(seen)):,} distinct events, "
                             f"{len(ids - set(seen)):,} missing, {len(set(seen) - ids):,} unknown; expected "
                             f"{len(ids):,} once each")
    return size / len(seen)


def one_round(dsn: str, client: dict[str, str], url: str, settings: Any, events: int, txn_size: int,
              order: list[Format], label: str) -> dict[str, tuple[float, float, float]]:
    """Three fresh outboxes with the same events, each relayed by its contender in ``order`` and checked;
    per contender: (seconds at the steady rate, CPU seconds of this process, mean value bytes)."""
    import psycopg2

    from outbox.encoding import encoder_for
    from outbox.schema import TableName, init_outbox
    from tidemark.config import RelayConfig, SchemaRegistryConfig

    run = uuid.uuid4().hex[:8]
    relays: dict[str, RelayConfig] = {}
    for fmt in CONTENDERS:
        relay = RelayConfig(id=f"bench-{run}-{fmt}", table=f"public.outbox_{run}_{fmt}",
                            topic=f"bench.{run}.{fmt}.{{aggregatetype}}", offsets_topic=f"bench.{run}.{fmt}.offsets",
                            manifest_topic=f"bench.{run}.{fmt}.manifest", ack_every=50, format=fmt)
        init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                    slot=relay.slot_name)
        topics = [relay.topic_for(a) for a in AGGREGATES]
        create_topics(client, topics)
        if fmt != "json":
            register(url, topics, fmt)
        relays[fmt] = relay
    t0 = time.perf_counter()
    ids = fill(dsn, [r.table for r in relays.values()], events, txn_size)
    print(f"{label}: {events:,} events in {events // txn_size:,} transactions written into 3 outboxes in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    results: dict[str, tuple[float, float, float]] = {}
    for fmt in order:
        relay = relays[fmt]
        encoder = encoder_for(relay, SchemaRegistryConfig(url=url), settings)
        cpu = time.process_time()
        with relay_encoding(encoder):
            elapsed = run_relay(dsn, client, relay, events)
        cpu = time.process_time() - cpu
        size = check_exactly_once(client["bootstrap.servers"], [relay.topic_for(a) for a in AGGREGATES], ids, fmt)
        results[fmt] = (elapsed, cpu, size)
        print(f"{label} {fmt}: {elapsed:.2f}s, {events / elapsed:,.0f} events/s, {cpu:.1f} CPU s in this "
              f"process; every event once, values {size:.0f} B", flush=True)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for relay in relays.values():
            cur.execute("SELECT pg_drop_replication_slot(%s)", (relay.slot_name,))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--txn-size", type=int, default=10, help="events per source transaction")
    parser.add_argument("--reps", type=int, default=3, help="runs per contender, order rotating")
    parser.add_argument("--warmup-events", type=int, default=20_000,
                        help="events of an untimed first round (the fresh broker's and registry's JIT; "
                        "more than one group's worth, as every timed run); 0: none")
    report_arguments(parser)
    args = parser.parse_args(argv)

    from infra.process import free_port_block
    from infra.registry import EmbeddedRegistry
    from tidemark.settings import load_settings

    load_before = loadavg()
    settings = load_settings()
    times: dict[str, list[float]] = {n: [] for n in CONTENDERS}
    cpus: dict[str, list[float]] = {n: [] for n in CONTENDERS}
    sizes: dict[str, list[float]] = {n: [] for n in CONTENDERS}
    orders: list[list[Format]] = []
    work = Path(tempfile.mkdtemp(prefix="tidemark-relay-format-bench-"))
    registry = EmbeddedRegistry(work / "registry", settings.home_dir, port=free_port_block(2, start=28400),
                                java=settings.registry.java)
    url = registry.start()
    try:
        with kafka_broker() as (bootstrap, broker_version), postgres(None) as dsn:
            client = {"bootstrap.servers": bootstrap}
            if args.warmup_events:  # the fresh broker's, registry's and process's first work, untimed
                one_round(dsn, client, url, settings, args.warmup_events, args.txn_size, list(CONTENDERS),
                          "warm-up (untimed)")
            for rep in range(args.reps):
                order = list(CONTENDERS[rep % 3:] + CONTENDERS[:rep % 3])
                orders.append(order)
                results = one_round(dsn, client, url, settings, args.events, args.txn_size, order, f"rep {rep + 1}")
                for fmt, (elapsed, cpu, size) in results.items():
                    times[fmt].append(elapsed)
                    cpus[fmt].append(cpu)
                    sizes[fmt].append(size)
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)

    rate = {n: args.events / statistics.median(times[n]) for n in CONTENDERS}
    ratio = {n: rate[n] / rate["json"] for n in CONTENDERS}
    # Per rep: a contender's rate over JSON's in the same rep (seconds of JSON over its own).
    rounds = {n: [j / t for j, t in zip(times["json"], times[n], strict=True)] for n in CONTENDERS}
    band = {n: [min(rounds[n]), max(rounds[n])] for n in CONTENDERS}
    value_bytes = {n: statistics.mean(sizes[n]) for n in CONTENDERS}
    lines = ["", *header("Outbox relay: Avro and Protobuf values against JSON", load_before),
             (f"Kafka {broker_version}, one broker; Apicurio Registry. {args.events:,} events of ~"
              f"{value_bytes['json']:.0f} B JSON over 3 topics (3 partitions each), in source transactions of "
              f"{args.txn_size}; relay defaults (group commit: linger 100 ms), `ack_every=50`; medians of "
              f"{args.reps}, order rotating, after an untimed round of {args.warmup_events:,} events."),
             "", "| relay format | events/s | value B | CPU µs per event in process | / json | noise band |",
             "|---|---:|---:|---:|---:|---|"]
    for n in CONTENDERS:
        lines.append(f"| {n} | {rate[n]:,.0f} | {value_bytes[n]:.0f} | "
                     f"{statistics.median(cpus[n]) / args.events * 1e6:.0f} | "
                     + ("1.00× | –" if n == "json" else f"**{ratio[n]:.2f}×** | {band[n][0]:.2f}–{band[n][1]:.2f}")
                     + " |")
    emit(lines, args.output)
    emit_json({"benchmark": "relay_format_bench", "events": args.events, "reps": args.reps,
               "txn_size": args.txn_size, "warmup_events": args.warmup_events, "orders": orders,
               "events_per_s": rate, "ratio_avro_vs_json": ratio["avro"], "ratio_protobuf_vs_json": ratio["protobuf"],
               "band": {"avro_vs_json": band["avro"], "protobuf_vs_json": band["protobuf"]},
               "round_ratios": {"avro_vs_json": rounds["avro"], "protobuf_vs_json": rounds["protobuf"]},
               "value_bytes": value_bytes, "runs_s": times, "process_cpu_s": cpus},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
