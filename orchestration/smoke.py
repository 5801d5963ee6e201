"""``make demo``: bring the stack up, run the product end to end, prove each piece, shut down.

First the facts every guarantee rests on, measured against the real servers: Kafka hides
an aborted transaction from read_committed readers (librdkafka and Spark's Kafka
source), Delta skips a replayed ``txnAppId``/``txnVersion`` write, PostgreSQL hands out a
logical replication slot. Then the pipeline itself: an application commits (and rolls
back) transactions with outbox events, the relay turns them into Kafka transactions,
and Prefect runs the ingest every few seconds into a Delta table, which must hold
exactly the committed events (:mod:`orchestration.demo`). The demo exits 0 only if all
hold, and removes its slot so no WAL is kept for it.
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
from tidemark.storage import tables_root

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
    client = endpoints.kafka_client()
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    producer = Producer({**client, "transactional.id": f"tidemark-smoke-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    for count, commit in ((COMMITTED // 2, True), (ABORTED, False), (COMMITTED // 2, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=str(i).encode(), value=f"{'ok' if commit else 'aborted'}-{i}".encode())
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    committed = read_to_end(endpoints.kafka_bootstrap, topic, extra=client)
    everything = read_to_end(endpoints.kafka_bootstrap, topic, isolation="read_uncommitted", extra=client)
    return [
        Check("Kafka read_committed hides the aborted transaction",
              len(committed) == COMMITTED and all(r.value and r.value.startswith(b"ok") for r in committed),
              f"{len(committed)} of {len(everything)} records visible (expected {COMMITTED} of {COMMITTED + ABORTED})"),
    ]


def _spark_checks(settings: Settings, endpoints: Endpoints, topic: str) -> list[Check]:
    # The product's session: started here once, used again by the product step, stopped by run_demo.
    from orchestration.flows import spark_session

    table = tables_root(settings, "demo", f"smoke-{topic}")
    spark = spark_session()
    df = (spark.read.format("kafka")
          .options(**endpoints.kafka_spark_options())  # read_committed
          .option("subscribe", topic)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest")
          .load())
    rows = df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value")
    seen = rows.count()
    for _ in range(2):  # the second write replays version 1: Delta must skip it
        (rows.write.format("delta").mode("append")
         .option("txnAppId", "tidemark-smoke").option("txnVersion", 1).save(table))
    in_table = spark.read.format("delta").load(table).count()
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


def run_demo(settings: Settings, *, keep: bool = False, duration: float = 60, value_format: str = "json") -> int:
    """The demo; ``value_format`` ``avro`` or ``protobuf`` needs ``settings.registry.enabled`` (the
    stack's registry)."""
    import os

    stack = Stack(settings)
    kafka, pg, prefect = stack.kafka(), stack.postgres(), stack.prefect()
    already_up = (bool(kafka and kafka.running_nodes()) or bool(pg and pg.running())
                  or bool(prefect and prefect.running()))
    print("Tidemark demo (the local stack, then the product end to end under Prefect)")
    registry = " and schema registry" if settings.registry.enabled else ""
    done = _step(f"starting the stack (Kafka KRaft, PostgreSQL{registry}, Prefect server)")
    endpoints = stack.up()
    os.environ["PREFECT_API_URL"] = stack.prefect_api()  # before Prefect is imported
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the demo prints its own progress
    done()
    topic = f"tidemark.smoke.{uuid.uuid4().hex[:8]}"
    checks: list[Check] = []
    summary = None
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
        admin = AdminClient(endpoints.kafka_client())  # kept alive for the future
        admin.delete_topics([topic])[topic].result(30)
        values = "" if value_format == "json" else f" ({value_format} through the schema registry)"
        done = _step(f"the product for {duration:.0f}s: an order service's transactions -> outbox -> supervised "
                     f"relay -> Kafka{values} -> ingest every 5s through Prefect -> Delta; then a quality audit")
        from orchestration import demo

        summary = demo.run(settings, endpoints, duration=duration, value_format=value_format)
        checks += [Check(name, ok, detail) for name, ok, detail in summary.checks]
        done()
    finally:
        from orchestration.flows import stop_spark

        stop_spark()
        if not keep and not already_up:
            done = _step("stopping the stack")
            stack.down()
            done()
    if summary is not None:
        print()
        width = max(len(k) for k, _ in summary.rows)
        for key, value in summary.rows:
            print(f"  {key:<{width}}  {value}")
    width = max(len(c.name) for c in checks)
    print()
    for c in checks:
        print(f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
    ok = all(c.ok for c in checks)
    print(f"\n{'exactly-once held: all checks passed' if ok else 'SOME CHECKS FAILED'}")
    if summary is not None:
        print(f"Data Docs: file://{summary.docs}")
    ui = prefect.ui_url if prefect else os.environ["PREFECT_API_URL"]
    if keep or already_up:
        print(f"Prefect UI: {ui} (flow runs, artifacts); the stack is still running: `tidemark stack down` stops it")
    else:
        print(f"Prefect UI: the runs are kept; `tidemark stack up --prefect` serves them again at {ui}")
    return 0 if ok else 1
