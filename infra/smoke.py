"""``make demo``: bring the stack up, run the product end to end, prove each piece, shut down.

First the facts every guarantee rests on, measured against the real servers: Kafka hides
an aborted transaction from read_committed readers (librdkafka and Spark's Kafka
source), Delta skips a replayed ``txnAppId``/``txnVersion`` write, PostgreSQL hands out a
logical replication slot. Then the pipeline itself: an application commits (and rolls
back) transactions with outbox events, the relay turns them into Kafka transactions,
and an ingest job loads the topics into a Delta table, which must hold exactly the
committed events. The demo exits 0 only if all hold, and removes its slot so no WAL is
kept for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.topic_reader import read_to_end
from infra.stack import Endpoints, Stack
from tidemark.settings import Settings

COMMITTED = 1000
ABORTED = 250


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _step(title: str) -> Callable[[], None]:
    print(f"  … {title}", flush=True)
    started = time.monotonic()

    def done() -> None:
        print(f"    done in {time.monotonic() - started:.1f}s", flush=True)

    return done


def _kafka_checks(endpoints: Endpoints, topic: str) -> list[Check]:
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap,
                         "transactional.id": f"tidemark-smoke-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    for count, commit in ((COMMITTED // 2, True), (ABORTED, False), (COMMITTED // 2, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=str(i).encode(), value=f"{'ok' if commit else 'aborted'}-{i}".encode())
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    committed = read_to_end(endpoints.kafka_bootstrap, topic)
    everything = read_to_end(endpoints.kafka_bootstrap, topic, isolation="read_uncommitted")
    return [
        Check("Kafka read_committed hides the aborted transaction",
              len(committed) == COMMITTED and all(r.value and r.value.startswith(b"ok") for r in committed),
              f"{len(committed)} of {len(everything)} records visible (expected {COMMITTED} of {COMMITTED + ABORTED})"),
    ]


def _spark_checks(settings: Settings, endpoints: Endpoints, topic: str) -> list[Check]:
    from infra.spark import build_session

    table = str(settings.home_dir / "demo" / f"smoke-{topic}")
    spark = build_session(settings, "tidemark-smoke")
    try:
        df = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest").option("endingOffsets", "latest")
              .option("kafka.isolation.level", "read_committed")
              .load())
        rows = df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value")
        seen = rows.count()
        for _ in range(2):  # the second write replays version 1: Delta must skip it
            (rows.write.format("delta").mode("append")
             .option("txnAppId", "tidemark-smoke").option("txnVersion", 1).save(table))
        in_table = spark.read.format("delta").load(table).count()
    finally:
        spark.stop()
    return [
        Check("Spark's Kafka source reads only committed records", seen == COMMITTED,
              f"{seen} rows (expected {COMMITTED})"),
        Check("Delta skips a replayed txnAppId/txnVersion write", in_table == COMMITTED,
              f"{in_table} rows after writing version 1 twice (expected {COMMITTED})"),
    ]


def _postgres_checks(endpoints: Endpoints) -> list[Check]:
    import psycopg2

    slot = f"tidemark_smoke_{uuid.uuid4().hex[:6]}"
    conn = psycopg2.connect(endpoints.postgres_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            wal_level = cur.fetchone()[0]  # type: ignore[index]
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            created = cur.fetchone()[0] == 1  # type: ignore[index]
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    finally:
        conn.close()
    return [Check("PostgreSQL serves a logical replication slot", wal_level == "logical" and created,
                  f"wal_level={wal_level}, pgoutput slot created={created}")]


def _pipeline_checks(settings: Settings, endpoints: Endpoints) -> list[Check]:
    """Outbox -> relay -> Kafka -> ingest -> Delta, on a fresh outbox table and topics."""
    import random
    import threading

    import psycopg2

    from infra.spark import build_session
    from outbox.relay import Relay
    from outbox.schema import TableName, add_event, init_outbox
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    run = uuid.uuid4().hex[:8]
    dsn, bootstrap = endpoints.postgres_dsn, endpoints.kafka_bootstrap
    config = parse_config({
        "kafka": {"bootstrap_servers": bootstrap},
        "relay": {"id": f"demo-{run}", "table": f"public.demo_outbox_{run}", "topic": f"demo.{run}.{{aggregatetype}}",
                  "offsets_topic": f"demo.{run}.relay-offsets"},
        "pipelines": [{"name": "demo", "topic_pattern": rf"demo\.{run}\.(order|payment)",
                       "target": str(settings.home_dir / "demo" / run / "events"),
                       "schema": "order_id BIGINT, amount DOUBLE", "lineage": ["topic", "partition", "offset", "key",
                                                                               "headers", "batch_id"]}]})
    relay = config.relay
    table = TableName.parse(relay.table)
    init_outbox(dsn, table=table, publication=relay.publication_name, slot=relay.slot_name)
    committed: set[str] = set()
    rng = random.Random(7)
    conn = psycopg2.connect(dsn)
    try:
        for order in range(60):
            events = [("order", rng.uniform(5, 500)), ("payment", rng.uniform(5, 500))][: rng.randint(1, 2)]
            with conn.cursor() as cur:
                ids = [str(add_event(cur, kind, f"order-{order}", f"{kind}.changed",
                                     {"order_id": order, "amount": round(amount, 2)}, table=relay.table))
                       for kind, amount in events]
            if order % 6 == 5:
                conn.rollback()  # the application changed its mind: these events must never appear
            else:
                conn.commit()
                committed.update(ids)
    finally:
        conn.close()
    report = Relay(relay, dsn=dsn, client_config={"bootstrap.servers": bootstrap}).run(threading.Event(),
                                                                                      idle_exit=2)
    spark = build_session(settings, "tidemark-demo")
    try:
        pipeline = config.pipelines[0]
        ingested = IngestJob(spark, config, pipeline, bootstrap).run_bounded()
        rows = spark.read.format("delta").load(pipeline.target).selectExpr(
            "filter(_kafka_headers, h -> h.key = 'id')[0].value AS id").collect()
    finally:
        spark.stop()
    ids = [bytes(r.id).decode() for r in rows if r.id is not None]
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:  # leave nothing that keeps WAL
            cur.execute("SELECT pg_drop_replication_slot(%s)", (relay.slot_name,))
            cur.execute(f'DROP PUBLICATION "{relay.publication_name}"')
            cur.execute(f"DROP TABLE {table.sql}")
    finally:
        conn.close()
    return [
        Check("the relay delivered each committed transaction once", report.events == len(committed),
              f"{report.transactions} transactions, {report.events} events relayed; {len(committed)} committed"),
        Check("the Delta table holds exactly the committed events", sorted(ids) == sorted(committed)
              and ingested.quarantined == 0,
              f"{len(ids)} rows ({len(set(ids))} distinct event ids) in {ingested.summary()}"),
    ]


def run_demo(settings: Settings, *, keep: bool = False) -> int:
    stack = Stack(settings)
    kafka = stack.kafka()
    pg = stack.postgres()
    already_up = bool(kafka and kafka.running_nodes()) or bool(pg and pg.running())
    print("Tidemark demo (the local stack, then the pipeline end to end)")
    done = _step("starting the stack (Kafka KRaft, PostgreSQL)")
    endpoints = stack.up()
    done()
    topic = f"tidemark.smoke.{uuid.uuid4().hex[:8]}"
    checks: list[Check] = []
    try:
        done = _step(f"transactional writes to {topic}: {COMMITTED} committed, {ABORTED} aborted")
        checks += _kafka_checks(endpoints, topic)
        done()
        done = _step("Spark reads the topic and writes a Delta table twice with the same txnVersion")
        checks += _spark_checks(settings, endpoints, topic)
        done()
        done = _step("PostgreSQL logical decoding")
        checks += _postgres_checks(endpoints)
        done()
        done = _step("end to end: application transactions -> outbox -> relay -> Kafka -> ingest -> Delta")
        checks += _pipeline_checks(settings, endpoints)
        done()
        admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        admin.delete_topics([topic])[topic].result(30)
    finally:
        if not keep and not already_up:
            done = _step("stopping the stack")
            stack.down()
            done()
    width = max(len(c.name) for c in checks)
    print()
    for c in checks:
        print(f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
    ok = all(c.ok for c in checks)
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'}"
          + ("; the stack is still running: `tidemark stack down` stops it" if keep or already_up else ""))
    return 0 if ok else 1
