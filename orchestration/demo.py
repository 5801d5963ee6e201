"""The demo's product run: app -> outbox -> supervised relay -> Kafka -> Prefect ingest -> Delta.

For ``duration`` seconds the sample application commits (and rolls back) multi-event
transactions; the relay runs under the supervisor flow; an ingest flow run starts every
``every`` seconds through Prefect. Then the relay drains, a last ingest catches up to the
LSO, the quality audit runs, and the summary is computed from the real sources: the
app's record of what it committed, the topics read read_committed, the Delta table.

Ingest runs are flow calls in this process, so they share one SparkSession and cost a
second or two each; under ``tidemark serve`` each run is its own process instead.

With ``value_format`` ``avro`` or ``protobuf`` the values go through the stack's schema
registry: the relay serializes each topic's payloads with its subject (``<topic>-value``,
registered here first), and the one pipeline over the three topics decodes each record with
its writer's schema into the subject its table follows (``demo.<run>.shop-value``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from infra.stack import Endpoints
from orchestration.sample_app import SampleApp
from tidemark.settings import Settings
from tidemark.storage import tables_root

SCHEMA = "order_id BIGINT, amount DOUBLE, carrier STRING"
#: :data:`SCHEMA` as the registry formats write it (a field an event lacks is null).
AVRO_SCHEMA = {"type": "record", "name": "ShopEvent", "namespace": "tidemark.demo", "fields": [
    {"name": "order_id", "type": "long"}, {"name": "amount", "type": ["null", "double"], "default": None},
    {"name": "carrier", "type": ["null", "string"], "default": None}]}
PROTOBUF_SCHEMA = """syntax = "proto3";
package tidemark.demo;
message ShopEvent {
  int64 order_id = 1;
  optional double amount = 2;
  optional string carrier = 3;
}
"""
KINDS = ("order", "payment", "shipment")


@dataclass(frozen=True)
class Summary:
    rows: list[tuple[str, str]]
    checks: list[tuple[str, bool, str]]
    docs: str


def _write_config(settings: Settings, endpoints: Endpoints, run: str, value_format: str) -> Path:
    root = settings.home_dir / "demo" / run
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tidemark.yaml"
    relay: dict[str, Any] = {}
    pipeline: dict[str, Any] = {"schema": SCHEMA}
    if value_format != "json":  # the embedded registry: no `schema_registry.url` needed
        relay, pipeline = {"format": value_format}, {"format": value_format, "subject": f"demo.{run}.shop-value"}
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap,
                  # The secured embedded cluster's admin, by file names: no secret in the config.
                  "security": endpoints.kafka_security.model_dump(mode="json", exclude_none=True,
                                                                  exclude_defaults=True)},
        "postgres": {"dsn": endpoints.postgres_dsn},
        "relay": {"id": f"demo-{run}", "table": f"public.demo_outbox_{run}", "topic": f"demo.{run}.{{aggregatetype}}",
                  "offsets_topic": f"demo.{run}.relay-offsets", "ack_every": 20, **relay},
        "pipelines": [{"name": "shop", "topic_pattern": rf"demo\.{run}\.({'|'.join(KINDS)})",
                       "target": f"{tables_root(settings, 'demo', run)}/events", **pipeline, "dedup": {},
                       "lineage": ["topic", "partition", "offset", "timestamp", "key", "batch_id"],
                       "schedule": {"retries": 2, "retry_delay_seconds": 2}}],
    }, sort_keys=False))
    return path


def _register(settings: Settings, config: Any, run: str) -> set[int]:
    """The demo's schema under each topic's subject (the relay's) and the pipeline's; the ids."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from connectors.registry import client_config, registry_url

    url = registry_url(config.schema_registry, settings)
    client = SchemaRegistryClient(client_config(config.schema_registry, url))
    schema = (Schema(json.dumps(AVRO_SCHEMA), "AVRO") if config.relay.format == "avro"
              else Schema(PROTOBUF_SCHEMA, "PROTOBUF"))
    subjects = [f"demo.{run}.{kind}-value" for kind in KINDS] + [config.pipelines[0].subject]
    return {int(client.register_schema(subject, schema)) for subject in subjects}


def _relay_child() -> psutil.Process | None:
    for child in psutil.Process().children(recursive=True):
        try:
            if "relay" in child.cmdline() and "run" in child.cmdline():
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def run(settings: Settings, endpoints: Endpoints, *, duration: float = 60, every: float = 5,
        progress: Any = print, value_format: str = "json") -> Summary:
    from orchestration.context import load
    from outbox.schema import TableName, init_outbox

    run_id = uuid.uuid4().hex[:8]
    config_path = _write_config(settings, endpoints, run_id, value_format)
    config = load(config_path)
    relay_cfg, pipeline = config.relay, config.pipelines[0]
    schema_ids = _register(settings, config, run_id) if value_format != "json" else set()
    table = TableName.parse(relay_cfg.table)
    init_outbox(endpoints.postgres_dsn, table=table, publication=relay_cfg.publication_name, slot=relay_cfg.slot_name)
    from orchestration.flows import audit_flow, ingest_flow, relay_flow, spark_session

    supervisor_state: dict[str, Any] = {}
    supervisor = threading.Thread(target=lambda: supervisor_state.update(
        state=relay_flow(config=str(config_path), return_state=True)), name="relay-supervisor", daemon=True)
    supervisor.start()
    app = SampleApp(endpoints.postgres_dsn, relay_cfg.table).start()
    started = time.monotonic()
    runs = rows = 0
    try:
        while (elapsed := time.monotonic() - started) < duration:
            result = ingest_flow(pipeline.name, str(config_path))
            runs += 1
            rows += result["rows"]
            with app.ledger.lock:
                committed, txns = len(app.ledger.events), app.ledger.transactions
            progress(f"    {elapsed:5.0f}s  app: {txns} transactions, {committed} events committed | "
                     f"ingest run {runs}: +{result['rows']} rows ({rows} total), lag {result['lag']} offsets")
            time.sleep(max(0.0, every - (time.monotonic() - started - elapsed)))
    finally:
        truth = app.stop()
    progress(f"    app stopped: {truth.transactions} transactions committed, {truth.rolled_back} rolled back")

    # Drain: the relay empties the outbox (acknowledged rows are deleted), then ingest catches up.
    import psycopg2

    deadline = time.monotonic() + 180
    while True:
        with psycopg2.connect(endpoints.postgres_dsn) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table.sql}")
            left = int(cur.fetchone()[0])  # type: ignore[index]
        if left == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    relay = _relay_child()
    if relay is not None:
        relay.terminate()  # SIGTERM: the relay finishes its transaction and exits 0; the supervisor ends
    supervisor.join(120)
    final = ingest_flow(pipeline.name, str(config_path))
    progress(f"    outbox drained ({left} rows left); final ingest run: +{final['rows']} rows, lag {final['lag']}")
    audit_state = audit_flow(pipeline.name, str(config_path), return_state=True)
    audit = audit_state.result(raise_on_failure=False)
    summary = _summarise(spark_session(), config, pipeline, truth.events, final["lag"], audit,
                         supervisor_state.get("state"), schema_ids)
    _cleanup(endpoints.postgres_dsn, relay_cfg, table)
    return summary


def _summarise(spark: Any, config: Any, pipeline: Any, committed: set[str], lag: int, audit: Any,
               supervisor: Any, schema_ids: set[int]) -> Summary:
    from connectors.admin import KafkaAdmin
    from connectors.kafka_config import librdkafka_config
    from connectors.topic_reader import read_to_end
    from orchestration.context import resolve_bootstrap
    from pipelines.dedup import EVENT_ID_COLUMN
    from pipelines.transactions.headers import TXN_COLUMN
    from quality import facts

    bootstrap = resolve_bootstrap(config)
    client = librdkafka_config(config.kafka, bootstrap)
    with KafkaAdmin(client) as admin:
        topics = admin.topics_matching(pipeline.topics, pipeline.topic_pattern)
    records = [r for t in topics for r in read_to_end(bootstrap, t, extra=client)]
    in_kafka = Counter(v.decode() for r in records for k, v in r.headers if k == "id")
    # Values of a registry format: Confluent's framing with an id registered for the demo.
    framed = sum(1 for r in records if r.value and r.value[:1] == b"\0"
                 and int.from_bytes(r.value[1:5], "big") in schema_ids)
    table = spark.read.format("delta").load(pipeline.target)
    in_delta = Counter(r[0] for r in table.select(EVENT_ID_COLUMN).collect())
    incomplete = facts.transactions(table).where("problem IS NOT NULL").count()
    txns_in_delta = table.select(f"{TXN_COLUMN}.id").distinct().count()
    duplicates = sum(n - 1 for n in in_delta.values() if n > 1)
    kafka_dupes = sum(n - 1 for n in in_kafka.values() if n > 1)
    audit_ok = isinstance(audit, dict) and bool(audit.get("passed"))
    docs = audit["docs"] if isinstance(audit, dict) else str(getattr(audit, "args", [""])[0])
    rows = [
        ("values in Kafka", pipeline.format if not schema_ids else
         f"{pipeline.format}, subject {pipeline.subject} (schema ids {', '.join(map(str, sorted(schema_ids)))})"),
        ("events committed in PostgreSQL", f"{len(committed):,}"),
        ("events in Kafka (read_committed)", f"{sum(in_kafka.values()):,} ({kafka_dupes} duplicates)"),
        ("events in Delta", f"{sum(in_delta.values()):,} in {txns_in_delta:,} source transactions"),
        ("duplicates in Delta", str(duplicates)),
        ("incomplete transactions in Delta", str(incomplete)),
        ("lag (offsets)", str(lag)),
        ("quality audit", "PASS" if audit_ok else "FAIL"),
    ]
    supervised = supervisor is not None and supervisor.is_completed()
    formats = [] if not schema_ids else [
        (f"every value in Kafka is {pipeline.format} by a registered schema", framed == len(records) > 0,
         f"{framed} of {len(records)} values framed with ids {sorted(schema_ids)}")]
    checks = [*formats,
        ("the relay delivered each committed event once, nothing rolled back",
         set(in_kafka) == committed and kafka_dupes == 0,
         f"{sum(in_kafka.values())} events in Kafka, {len(committed)} committed"),
        ("the Delta table holds exactly the committed events", set(in_delta) == committed and duplicates == 0,
         f"{sum(in_delta.values())} rows, {len(in_delta)} distinct event ids"),
        ("every source transaction is whole in Delta", incomplete == 0 and txns_in_delta > 0,
         f"{txns_in_delta} transactions, {incomplete} incomplete"),
        ("ingest caught up and the quality audit passed", lag == 0 and audit_ok, f"lag {lag}; Data Docs {docs}"),
        ("the supervised relay stopped cleanly", supervised,
         "supervisor flow " + (supervisor.name if supervisor is not None else "never finished")),
    ]
    return Summary(rows, checks, docs)


def _cleanup(dsn: str, relay: Any, table: Any) -> None:
    """Drop the slot (it would keep WAL forever), the publication and the demo's outbox."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND NOT active", (relay.slot_name,))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{relay.publication_name}"')
            cur.execute(f"DROP TABLE IF EXISTS {table.sql}")
    finally:
        conn.close()
