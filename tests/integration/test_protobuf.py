"""``format: protobuf`` on a real schema registry (Apicurio), Kafka, Spark and Delta.

A subject evolves while the pipeline runs: v1, then v2 adds a field, then v3 widens
int32→int64 (the pipeline opted into type widening). Each record is parsed with its own writer schema (v1 records written after v3
exists still with v1) and read into the newest version's message by field number; the
table's schema follows in the batches' own commits. Bad values are quarantined with their
reason; an incompatible version stops the pipeline before anything is written.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from offsets.ledger import Ledger
from pipelines.evolution import SchemaConflictError
from tests.integration.test_avro import _columns, _delete_version, _produce, _set_compatibility
from tests.integration.test_avro import _ingest as ingest
from tests.protobuf_helpers import framed, register
from tidemark.config import parse_config

HEAD = 'syntax = "proto3";\npackage shop;\nimport "google/protobuf/timestamp.proto";\n'
TAIL = ("message Line { string sku = 1; double price = 2; }\n"
        "enum Status { NEW = 0; PAID = 1; }\n")
FIELDS = ("optional string note = 2; Status status = 3; repeated string tags = 4; "
          "google.protobuf.Timestamp at = 5; map<string, int64> counts = 6; Line line = 7;")
V1 = HEAD + "message Order { int32 id = 1; " + FIELDS + " }\n" + TAIL
V2 = HEAD + "message Order { int32 id = 1; " + FIELDS + " string channel = 8; }\n" + TAIL
V3 = HEAD + "message Order { int64 id = 1; " + FIELDS + " string channel = 8; }\n" + TAIL
V4 = HEAD + "message Order { string id = 1; " + FIELDS + " string channel = 8; }\n" + TAIL


def _ingest(spark, bootstrap: str, topic: str, target: str, **extra: Any):  # type: ignore[no-untyped-def]
    return ingest(spark, bootstrap, topic, target, **{"format": "protobuf", **extra})


def test_a_protobuf_subject_evolving_mid_stream_lands_every_record_with_its_writer_schema(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str, tmp_path) -> None:
    topic = topic_factory("protobuf")
    subject = f"{topic}-value"
    target = f"{table_root}/orders"
    v1 = register(schema_registry, subject, V1)
    full = {"note": "first", "status": "PAID", "tags": ["a", "b"], "at": "2026-01-02T03:04:05.000006Z",
            "counts": {"x": 7}, "line": {"sku": "s-1", "price": 2.5}}
    _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": 0, **full}),
                                      *(framed(v1, V1, {"id": i}) for i in range(1, 5))])
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 5
    after_v1 = spark.read.format("delta").load(target)
    assert _columns(after_v1) == {"id": "int", "note": "string", "status": "string", "tags": "array<string>",
                                  "at": "timestamp", "counts": "map<string,bigint>",
                                  "line": "struct<sku:string,price:double>"}
    rows = {r.id: r for r in after_v1.collect()}
    first = rows[0]
    assert (first.note, first.status, first.tags, first.counts) == ("first", "PAID", ["a", "b"], {"x": 7})
    assert first.at.astimezone(dt.UTC) == dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert (first.line.sku, first.line.price) == ("s-1", 2.5)
    # Unset: null where the field has presence (optional, a message), the default where it has not.
    assert (rows[1].note, rows[1].status, rows[1].tags, rows[1].at, rows[1].line) == (None, "NEW", [], None, None)

    v2 = register(schema_registry, subject, V2)
    _produce(kafka_bootstrap, topic, [framed(v2, V2, {"id": 10 + i, "channel": "app"}) for i in range(3)])
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 3

    _set_compatibility(schema_registry, subject, "NONE")  # Apicurio's BACKWARD refuses int32 -> int64
    v3 = register(schema_registry, subject, V3)
    assert len({v1, v2, v3}) == 3
    values = [framed(v3, V3, {"id": 2**40 + i, "note": "big", "channel": "api"}) for i in range(3)]
    values += [framed(v1, V1, {"id": 20 + i, "note": "late v1"}) for i in range(2)]  # v1 writers after v3 exists
    good = framed(v3, V3, {"id": 2**41, "channel": "y" * 40})
    bad = {b"\x01" + good[1:]: "not Confluent-framed Protobuf",
           framed(9_999_999, V3, {"id": 1}): "unknown schema id 9999999",
           good[:-5]: f"value does not decode as Protobuf with schema id {v3}",
           framed(v3, V3, {"sku": "not an order"}, name="shop.Line"): "message shop.Line is not the pipeline's",
           b"\x00\x00": "not Confluent-framed Protobuf"}
    _produce(kafka_bootstrap, topic, [*values, *bad])
    report = _ingest(spark, kafka_bootstrap, topic, target, type_widening="allow")
    assert (report.rows, report.quarantined) == (5, len(bad))

    table = spark.read.format("delta").load(target)
    assert _columns(table)["id"] == "bigint" and _columns(table)["channel"] == "string"
    rows = {r.id: (r.note, r.channel) for r in table.collect()}
    assert rows[0] == ("first", None)  # written before the column existed: null
    assert rows[10] == (None, "app")
    assert rows[2**40] == ("big", "api")
    assert rows[20] == ("late v1", "")  # a v1 record read into v3: proto3's default for the field
    assert len(rows) == 13
    reasons = {bytes(r.value): r.error for r in spark.read.format("delta").load(f"{target}_quarantine").collect()}
    assert set(reasons) == set(bad)
    for value, expected in bad.items():
        assert expected in reasons[value], (value, reasons[value])

    # Every Delta version of the target read back on its own: its schema and its rows.
    from delta.tables import DeltaTable

    seen = []
    for (version,) in sorted(DeltaTable.forPath(spark, target).history().select("version").collect()):
        at = spark.read.format("delta").option("versionAsOf", version).load(target)
        seen.append((at.count(), _columns(at).get("id"), "channel" in at.columns))
    assert seen[0] == (5, "int", False)
    assert (8, "int", True) in seen
    assert seen[-1] == (13, "bigint", True)

    last = Ledger(spark, f"{target}_tidemark_ledger", "orders").last()
    assert last is not None and last.schemas is not None
    assert (last.schemas.subject, last.schemas.writers, last.schemas.reader) == (subject, (v1, v2, v3), v3)

    from offsets.tables import table_shape
    from orchestration.status import schema_summary

    shape = table_shape(target)
    assert shape is not None
    assert schema_summary("protobuf", last, shape) == (f"{subject}: id {v3} (also reads ids {v1}, {v2}); "
                                                       f"target {len(table.columns)} columns")

    # The quality suite's column check follows the reader message (nested fields as `line.sku`).
    from quality.audit import audit, expected_columns, registry_of

    config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": target,
                                          "format": "protobuf", "schema_evolution": "strict"}]})
    pipeline = config.pipelines[0]
    checked = audit(spark, pipeline, kafka_options={"kafka.bootstrap.servers": kafka_bootstrap},
                    client_config={"bootstrap.servers": kafka_bootstrap}, docs_dir=tmp_path / "docs",
                    registry=registry_of(config, pipeline))
    (columns,) = [v for v in checked.verdicts if v.check.startswith("columns")]
    (types,) = [v for v in checked.verdicts if v.check.startswith("column types")]
    assert columns.passed and types.passed, (columns, types)
    assert {"id", "channel", "line", "line.sku", "counts"} <= set(expected_columns(pipeline, V3))

    # An incompatible version: a clear stop, nothing claimed or written; once the operator
    # deletes the version, the pipeline goes on.
    register(schema_registry, subject, V4)
    _produce(kafka_bootstrap, topic, [framed(v3, V3, {"id": 99, "channel": "z"})])
    with pytest.raises(SchemaConflictError, match="field id is bigint in the table and string in the batch"):
        _ingest(spark, kafka_bootstrap, topic, target)
    assert Ledger(spark, f"{target}_tidemark_ledger", "orders").last().batch_id == last.batch_id  # type: ignore[union-attr]
    _delete_version(schema_registry, subject, 4)
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 1


def test_an_avro_subject_under_format_protobuf_stops_with_a_clear_line(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str) -> None:
    from tests.avro_helpers import framed as avro_framed
    from tests.avro_helpers import register as avro_register
    from tidemark.errors import ConfigError

    topic = topic_factory("protobuf-avro")
    schema = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}
    schema_id = avro_register(schema_registry, f"{topic}-value", schema)
    _produce(kafka_bootstrap, topic, [avro_framed(schema_id, schema, {"id": 1})])
    target = f"{table_root}/orders-avro"
    with pytest.raises(ConfigError, match="is not a Protobuf schema"):
        _ingest(spark, kafka_bootstrap, topic, target)
    assert Ledger(spark, f"{target}_tidemark_ledger", "orders").last() is None


COMMON = 'syntax = "proto3";\npackage shop.common;\nmessage Money { double amount = 1; string currency = 2; }\n'
WITH_REFERENCE = ('syntax = "proto3";\npackage shop;\nimport "shop/common.proto";\n'
                  "message Order { int64 id = 1; shop.common.Money total = 2; }\n")


def test_a_schema_importing_another_subject_by_reference_is_read_and_relayed(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str) -> None:
    """Confluent's schema references: the imported subject's schema is compiled beside the schema,
    in the ingest (the writer's and the reader's) and in the relay's encoder."""
    from outbox.protobuf import ProtobufEncoder
    from tidemark.config import SchemaRegistryConfig
    from tidemark.settings import settings

    topic = topic_factory("protobuf-refs")
    common = f"{topic}-common"
    register(schema_registry, common, COMMON)
    schema_id = register(schema_registry, f"{topic}-value", WITH_REFERENCE, {"shop/common.proto": (common, 1)})
    written = framed(schema_id, WITH_REFERENCE, {"id": 1, "total": {"amount": 2.5, "currency": "EUR"}},
                     imports={"shop/common.proto": COMMON})
    relayed = ProtobufEncoder(SchemaRegistryConfig(url=schema_registry), settings()).encode(
        topic, b'{"id": 2, "total": {"amount": 7, "currency": "USD"}}')
    assert relayed is not None and relayed[1:5] == schema_id.to_bytes(4, "big")
    _produce(kafka_bootstrap, topic, [written, relayed])
    target = f"{table_root}/orders-refs"
    report = _ingest(spark, kafka_bootstrap, topic, target)
    assert (report.rows, report.quarantined) == (2, 0)
    table = spark.read.format("delta").load(target)
    assert _columns(table) == {"id": "bigint", "total": "struct<amount:double,currency:string>"}
    assert {r.id: (r.total.amount, r.total.currency) for r in table.collect()} == {1: (2.5, "EUR"), 2: (7.0, "USD")}
