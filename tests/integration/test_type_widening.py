"""A type widening reaches the table only when the pipeline opts in (real registry, Kafka, Spark,
Delta and delta-rs).

Widening a column turns on Delta's ``typeWidening`` reader feature, and a reader that lacks it
(delta-rs, and Polars and DuckDB through it) refuses every version of the table. So a
BACKWARD-compatible version that widens a field stops the pipeline by default, before its
claim: the records wait in Kafka, nothing is quarantined, and the table stays readable by
every reader. ``type_widening: allow`` lets the same records in.
"""

from __future__ import annotations

import pytest

from offsets.ledger import Ledger
from pipelines.evolution import SchemaConflictError
from tests.avro_helpers import framed, register
from tests.integration.test_avro import V1, _columns, _ingest, _produce
from tidemark.config import parse_config
from tidemark.errors import ConfigError

WIDE = {**V1, "fields": [{"name": "id", "type": "long"}, *V1["fields"][1:]]}  # type: ignore[index]


def _version(spark, target: str) -> int:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, target).history(1).first().version)


def _delta_rs_rows(target: str, version: int) -> int:
    from deltalake import DeltaTable

    from tidemark.storage import delta_rs_options

    return DeltaTable(target, version=version, storage_options=delta_rs_options(target)).to_pyarrow_table().num_rows


@pytest.mark.slow
def test_a_widening_stops_by_default_and_goes_on_once_the_pipeline_opts_in(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, schema_registry: str) -> None:
    topic = topic_factory("avro-widen")
    subject = f"{topic}-value"
    target = f"{table_root}/orders"
    ledger = Ledger(spark, f"{target}_tidemark_ledger", "orders")
    v1 = register(schema_registry, subject, V1)
    _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": i, "note": "v1"}) for i in range(4)])
    assert _ingest(spark, kafka_bootstrap, topic, target).rows == 4

    v3 = register(schema_registry, subject, WIDE)  # the registry's BACKWARD rule lets int -> long in
    _produce(kafka_bootstrap, topic, [framed(v3, WIDE, {"id": 2**40 + i, "note": "wide"}) for i in range(3)]
             + [framed(v1, V1, {"id": 10, "note": "late v1"})])
    claimed, version = ledger.last().batch_id, _version(spark, target)  # type: ignore[union-attr]

    with pytest.raises(SchemaConflictError) as stopped:
        _ingest(spark, kafka_bootstrap, topic, target)
    said = str(stopped.value)
    assert stopped.value.exit_code == ConfigError.exit_code == 78
    assert "\n" not in said
    assert "field id is int in the table and bigint in the batch" in said
    assert "`type_widening: allow`" in said and "delta-spark 4.0" in said and "delta-rs" in said
    assert "new name" in said
    # Stopped before its claim: nothing planned, written or quarantined; the records wait in Kafka.
    assert ledger.last().batch_id == claimed and _version(spark, target) == version  # type: ignore[union-attr]
    from offsets.tables import delta_table_exists

    assert not delta_table_exists(spark, f"{target}_quarantine")
    # A table that never opted in: delta-rs reads every one of its versions.
    assert [_delta_rs_rows(target, v) for v in range(version + 1)][-1] == 4
    assert _columns(spark.read.format("delta").load(target))["id"] == "int"

    report = _ingest(spark, kafka_bootstrap, topic, target, type_widening="allow")
    assert (report.rows, report.quarantined) == (4, 0)
    table = spark.read.format("delta").load(target)
    assert _columns(table)["id"] == "bigint"
    assert sorted(r.id for r in table.collect()) == [0, 1, 2, 3, 10, 2**40, 2**40 + 1, 2**40 + 2]
    # The opt-in is what cuts delta-rs off (the reason for the default).
    with pytest.raises(Exception, match="(?i)typeWidening"):
        _delta_rs_rows(target, _version(spark, target))


def test_type_widening_allow_under_strict_is_one_line_at_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pipeline = {"name": "orders", "topics": ["t"], "target": str(tmp_path / "t"), "schema": "id INT"}
    with pytest.raises(ConfigError) as refused:
        parse_config({"pipelines": [{**pipeline, "schema_evolution": "strict", "type_widening": "allow"}]})
    (line,) = str(refused.value).splitlines()[1:]
    assert "type_widening: allow" in line and "schema_evolution: strict" in line
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.type_widening: .*'refuse' or 'allow'"):
        parse_config({"pipelines": [{**pipeline, "type_widening": True}]})
    assert parse_config({"pipelines": [pipeline]}).pipelines[0].type_widening == "refuse"
