"""``tidemark status``'s schema column (pure formatting of the newest intent and the target's shape)."""

from __future__ import annotations

from datetime import UTC, datetime

from offsets.ledger import Intent, Schemas
from offsets.tables import TableShape
from orchestration.status import schema_summary


def _intent(schemas: Schemas | None) -> Intent:
    return Intent("orders", 3, "w", datetime(2026, 12, 2, tzinfo=UTC), (), schemas=schemas)


def test_avro_shows_the_reader_id_and_the_other_writers() -> None:
    shape = TableShape("/t", 7, 3, 300, 0, columns=12)
    assert schema_summary("avro", _intent(Schemas("orders-value", (4, 9, 11), 11)), shape) == (
        "orders-value: id 11 (also reads ids 4, 9); target 12 columns")
    assert schema_summary("avro", _intent(Schemas("orders-value", (4,), 4)), None) == "orders-value: id 4"
    assert schema_summary("avro", None, None) == "no batch yet"


def test_json_shows_the_target_columns_only() -> None:
    assert schema_summary("json", _intent(None), TableShape("/t", 1, 1, 1, 0, columns=5)) == "target 5 columns"
    assert schema_summary("json", None, None) == "-"


def test_a_batch_schemas_survive_the_ledger_row_round_trip() -> None:
    from offsets.ledger import Range, _intent

    intent = Intent("p", 4, "w", datetime(2026, 1, 1, tzinfo=UTC), (Range("t", 0, 0, 30),),
                    schemas=Schemas("t-value", (1, 5, 8), 8))
    row = dict(zip(("pipeline", "batch_id", "writer", "planned_at", "ranges", "decisions"), intent.row(), strict=True))
    row["ranges"] = [dict(zip(("topic", "partition", "start_offset", "end_offset"), r, strict=True))
                     for r in row["ranges"]]
    assert _intent(row) == intent and _intent(row).schemas == Schemas("t-value", (1, 5, 8), 8)


def test_the_quality_suite_expects_an_avro_readers_fields_as_spark_avro_decodes_them() -> None:
    from quality.audit import avro_columns

    reader = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [
            {"name": "city", "type": "string"}]}], "default": None},
        {"name": "choice", "type": ["null", "int", "string"]}]}
    assert avro_columns(reader) == ["id", "ship", "ship.city", "choice"]
