"""``format: avro`` on a real schema registry (Apicurio), Kafka, Spark and Delta.

A subject evolves while the pipeline runs: v1, then v2 adds a field with a default, then v3
widens int→long (the pipeline opted into type widening). Each record is decoded with its own writer schema (v1 records written
after v3 exists still with v1) into the newest version, and the table's schema follows in
the batches' own commits. Bad values are quarantined with their reason; an incompatible
version stops the pipeline before anything is written.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import pytest

from offsets.ledger import Ledger
from pipelines.evolution import SchemaConflictError
from pipelines.ingest import IngestJob
from tests.avro_helpers import framed, register
from tests.kafka_helpers import settled_lsos, transactional_producer
from tidemark.config import parse_config

V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "int"}, {"name": "note", "type": ["null", "string"], "default": None}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}  # type: ignore[list-item]
V3 = {**V2, "fields": [{"name": "id", "type": "long"}, *V2["fields"][1:]]}  # type: ignore[index]
V4 = {**V3, "fields": [{"name": "id", "type": "string"}, *V3["fields"][1:]]}  # type: ignore[index]


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=str(i).encode())
    producer.commit_transaction(30)
    settled_lsos(bootstrap, topic, 1)


def _ingest(spark, bootstrap: str, topic: str, target: str, **extra: Any):  # type: ignore[no-untyped-def]
    config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": target, "format": "avro",
                                          **extra}]})  # extra may name another format
    return IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()


def _columns(df) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {name: kind for name, kind in df.dtypes if not name.startswith("_")}


def test_a_subject_evolving_mid_stream_lands_every_record_with_its_writer_schema(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str, tmp_path) -> None:
    topic = topic_factory("avro")
    subject = f"{topic}-value"
    target = f"{table_root}/orders"
    v1 = register(schema_registry, subject, V1)
    _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": i, "note": f"v1-{i}"}) for i in range(5)])
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 5
    after_v1 = spark.read.format("delta").load(target)
    assert _columns(after_v1) == {"id": "int", "note": "string"}

    v2 = register(schema_registry, subject, V2)
    _produce(kafka_bootstrap, topic, [framed(v2, V2, {"id": 10 + i, "note": None, "channel": "app"})
                                      for i in range(3)])
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 3

    v3 = register(schema_registry, subject, V3)
    assert len({v1, v2, v3}) == 3
    values = [framed(v3, V3, {"id": 2**40 + i, "note": "big", "channel": "api"}) for i in range(3)]
    values += [framed(v1, V1, {"id": 20 + i, "note": "late v1"}) for i in range(2)]  # v1 writers after v3 exists
    good = framed(v3, V3, {"id": 2**41, "note": "x", "channel": "y"})
    bad = {b"\x01" + good[1:]: "not Confluent-framed Avro",
           framed(9_999_999, V3, {"id": 1, "note": None, "channel": "c"}): "unknown schema id 9999999",
           good[:7]: f"value does not decode as Avro with schema id {v3}",
           b"\x00\x00": "not Confluent-framed Avro"}
    _produce(kafka_bootstrap, topic, [*values, *bad])
    report = _ingest(spark, kafka_bootstrap, topic, target, type_widening="allow")
    assert (report.rows, report.quarantined) == (5, 4)

    table = spark.read.format("delta").load(target)
    assert _columns(table) == {"id": "bigint", "note": "string", "channel": "string"}
    rows = {r.id: (r.note, r.channel) for r in table.collect()}
    assert rows[0] == ("v1-0", None)  # written before the column existed: null, not the default
    assert rows[10] == (None, "app")
    assert rows[2**40] == ("big", "api")
    assert rows[20] == ("late v1", "web")  # a v1 record read into v3: the default
    assert len(rows) == 13
    reasons = {bytes(r.value): r.error for r in spark.read.format("delta").load(f"{target}_quarantine").collect()}
    assert set(reasons) == set(bad)
    for value, expected in bad.items():
        assert expected in reasons[value], (value, reasons[value])
    offsets = [r._kafka_offset for r in table.select("_kafka_offset").collect()]
    assert len(offsets) == len(set(offsets)) == 13  # each record once

    # Every Delta version of the target read back on its own: its schema and its rows.
    from delta.tables import DeltaTable

    history = sorted(DeltaTable.forPath(spark, target).history().select("version").collect())
    seen = []
    for (version,) in history:
        at = spark.read.format("delta").option("versionAsOf", version).load(target)
        seen.append((at.count(), tuple(sorted(_columns(at).items()))))
    assert seen[0] == (5, (("id", "int"), ("note", "string")))
    assert (8, (("channel", "string"), ("id", "int"), ("note", "string"))) in seen
    assert seen[-1] == (13, (("channel", "string"), ("id", "bigint"), ("note", "string")))

    # The batch's schemas are in its intent: a replay decodes with the same ones.
    last = Ledger(spark, f"{target}_tidemark_ledger", "orders").last()
    assert last is not None and last.schemas is not None
    assert (last.schemas.subject, last.schemas.writers, last.schemas.reader) == (subject, (v1, v2, v3), v3)

    # `tidemark status` shows the ids the newest batch decoded with and the target's columns (by
    # delta-rs, on a table whose type widening Spark turned on).
    from offsets.tables import table_shape
    from orchestration.status import schema_summary

    shape = table_shape(target)
    assert shape is not None and shape.columns == len(table.columns)
    assert schema_summary("avro", last, shape) == (f"{subject}: id {v3} (also reads ids {v1}, {v2}); "
                                                   f"target {len(table.columns)} columns")

    # The quality suite checks the table's columns against the newest batch's reader schema (v3),
    # at least those under additive evolution, exactly those under strict.
    from quality.audit import audit, expected_columns, registry_of

    for mode in ("additive", "strict"):
        config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": target,
                                              "format": "avro", "schema_evolution": mode}]})
        pipeline = config.pipelines[0]
        report = audit(spark, pipeline, kafka_options={"kafka.bootstrap.servers": kafka_bootstrap},
                       client_config={"bootstrap.servers": kafka_bootstrap}, docs_dir=tmp_path / "docs",
                       registry=registry_of(config, pipeline))
        (columns,) = [v for v in report.verdicts if v.check.startswith("columns")]
        (types,) = [v for v in report.verdicts if v.check.startswith("column types")]
        assert columns.passed and types.passed, (columns, types)
        assert {"id", "note", "channel"} <= set(expected_columns(pipeline, json.dumps(V3)))

    # An incompatible version (the subject's compatibility turned off to let it in): a clear stop,
    # nothing claimed or written; once the operator deletes the version, the pipeline goes on.
    _set_compatibility(schema_registry, subject, "NONE")
    v4 = register(schema_registry, subject, V4)
    _produce(kafka_bootstrap, topic, [framed(v3, V3, {"id": 99, "note": None, "channel": "z"})])
    claimed = last.batch_id
    with pytest.raises(SchemaConflictError, match="field id is bigint in the table and string in the batch"):
        _ingest(spark, kafka_bootstrap, topic, target)
    assert Ledger(spark, f"{target}_tidemark_ledger", "orders").last().batch_id == claimed  # type: ignore[union-attr]
    _delete_version(schema_registry, subject, 4)
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 1
    assert v4 not in Ledger(spark, f"{target}_tidemark_ledger", "orders").last().schemas.writers  # type: ignore[union-attr]


def _set_compatibility(url: str, subject: str, level: str) -> None:
    request = urllib.request.Request(f"{url}/config/{subject}", method="PUT",
                                     data=json.dumps({"compatibility": level}).encode(),
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    urllib.request.urlopen(request, timeout=10).read()


def _delete_version(url: str, subject: str, version: int) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/subjects/{subject}/versions/{version}", method="DELETE"),
                           timeout=10).read()


def test_a_registry_that_does_not_answer_is_transient_and_quarantines_nothing(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str) -> None:
    from tidemark.errors import ServiceUnavailableError

    topic = topic_factory("avro-down")
    v1 = register(schema_registry, f"{topic}-value", V1)
    _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": i, "note": None}) for i in range(4)])
    target = f"{table_root}/orders-{uuid.uuid4().hex[:6]}"
    nowhere = {"schema_registry": {"url": "http://127.0.0.1:9/apis/ccompat/v7"}}
    config = parse_config({**nowhere, "pipelines": [{"name": "orders", "topics": [topic], "target": target,
                                                     "format": "avro"}]})
    with pytest.raises(ServiceUnavailableError, match="does not answer"):  # no patience: at the first outage
        IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded(patience=0)
    ledger = Ledger(spark, f"{target}_tidemark_ledger", "orders")
    assert ledger.last() is None  # waited before its claim: nothing planned, nothing quarantined
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 4


@pytest.mark.slow
def test_a_follower_waits_out_a_killed_registry_and_quarantines_nothing(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, settings, tmp_path) -> None:
    """The registry SIGKILLed under ``--follow`` and started again later (its ids kept on disk):
    the follower waits, then lands every record; none is quarantined."""
    import signal
    import threading
    import time

    from infra.registry import EmbeddedRegistry
    from tests.stack_fixtures import free_port_block

    registry = EmbeddedRegistry(tmp_path / "registry", settings.home_dir, port=free_port_block(2, start=28200),
                                java=settings.registry.java)
    url = registry.start()
    topic = topic_factory("avro-follow")
    v1 = register(url, f"{topic}-value", V1)
    target = f"{table_root}/orders"
    config = parse_config({"schema_registry": {"url": url}, "pipelines": [
        {"name": "orders", "topics": [topic], "target": target, "format": "avro", "trigger_interval_seconds": 0.5}]})
    job = IngestJob(spark, config, config.pipelines[0], kafka_bootstrap)
    stop = threading.Event()
    follower = threading.Thread(target=job.follow, args=(stop,), daemon=True)
    try:
        _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": i, "note": None}) for i in range(5)])
        follower.start()
        deadline = time.monotonic() + 120
        while _count(spark, target) < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _count(spark, target) == 5

        process = registry.pidfile.process()
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": 100 + i, "note": "during"}) for i in range(7)])
        time.sleep(20)  # the follower's plans meet a registry that does not answer
        assert follower.is_alive() and _count(spark, target) == 5

        registry.start()
        deadline = time.monotonic() + 180
        while _count(spark, target) < 12 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _count(spark, target) == 12
        assert not _exists(spark, f"{target}_quarantine")  # nothing quarantined for the outage
    finally:
        stop.set()
        follower.join(120)
        registry.stop()
    assert not follower.is_alive()


def _count(spark, path: str) -> int:  # type: ignore[no-untyped-def]
    return spark.read.format("delta").load(path).count() if _exists(spark, path) else 0


def _exists(spark, path: str) -> bool:  # type: ignore[no-untyped-def]
    from offsets.tables import delta_table_exists

    return delta_table_exists(spark, path)


def test_a_pipeline_of_several_topics_reads_each_topics_own_subject_into_its_subject(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str) -> None:
    """Producers register under their topic's subject (TopicNameStrategy, as the relay does); the
    pipeline's `subject` names the schema its table follows. A record written with a version of
    neither subject is quarantined as an unknown id."""
    first, second = topic_factory("avro-a"), topic_factory("avro-b")
    reader = f"shop-{uuid.uuid4().hex[:8]}-value"
    v1 = register(schema_registry, f"{first}-value", V1)
    v2 = register(schema_registry, f"{second}-value", V2)
    register(schema_registry, reader, V1)
    newest = register(schema_registry, reader, V2)
    elsewhere = register(schema_registry, f"elsewhere-{uuid.uuid4().hex[:8]}-value",
                         {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "double"}]})
    _produce(kafka_bootstrap, first, [framed(v1, V1, {"id": i, "note": "a"}) for i in range(3)]
             + [framed(elsewhere, {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "double"}]},
                       {"x": 1.5})])
    _produce(kafka_bootstrap, second, [framed(v2, V2, {"id": 10 + i, "note": None, "channel": "app"})
                                       for i in range(2)])
    target = f"{table_root}/shop"
    config = parse_config({"pipelines": [{"name": "shop", "topics": [first, second], "subject": reader,
                                          "target": target, "format": "avro"}]})
    report = IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded()
    assert (report.rows, report.quarantined) == (5, 1)
    rows = {r.id: (r.note, r.channel) for r in spark.read.format("delta").load(target).collect()}
    assert rows == {0: ("a", "web"), 1: ("a", "web"), 2: ("a", "web"), 10: (None, "app"), 11: (None, "app")}
    (reason,) = [r.error for r in spark.read.format("delta").load(f"{target}_quarantine").collect()]
    assert f"unknown schema id {elsewhere}" in reason
    last = Ledger(spark, f"{target}_tidemark_ledger", "shop").last()
    assert last is not None and last.schemas is not None
    assert last.schemas.reader == newest and {v1, v2} <= set(last.schemas.writers)
    assert elsewhere not in last.schemas.writers
