"""A pipeline's schema changes while it runs (real Kafka, Spark and Delta).

Additive changes (a new field, a removed one, and a widening Delta makes by itself once the
pipeline opts into it) go on, each in the batch's own commit; any other change, or any change
under ``strict``, stops before anything is claimed or written, and the pipeline goes on once
the operator undoes it (or, for a widening, opts in).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from offsets.ledger import Ledger
from pipelines.evolution import SchemaConflictError
from pipelines.ingest import IngestJob
from tests.ingest_harness import assert_exactly_once, ingest_argv, process_env, write_config
from tests.kafka_helpers import settled_lsos, transactional_producer, write_transaction
from tidemark.config import parse_config


def _config(topic: str, target: str, schema: str, **extra: object):  # type: ignore[no-untyped-def]
    return parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": target, "schema": schema,
                                        **extra}]})


def _ingest(spark, bootstrap: str, topic: str, target: str, schema: str, **extra: object):  # type: ignore[no-untyped-def]
    config = _config(topic, target, schema, **extra)
    return IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()


def _produce(bootstrap: str, topic: str, events: list[dict[str, object]], partitions: int = 1) -> None:
    """One committed transaction, below the LSO once this returns (its markers written)."""
    producer = transactional_producer(bootstrap)
    write_transaction(producer, topic, [json.dumps(e).encode() for e in events], commit=True)
    settled_lsos(bootstrap, topic, partitions)


def _log_entry(target: str, version: int) -> list[dict[str, object]]:
    from tests.conftest import on_disk

    text = (on_disk(target) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line]


def _version(spark, target: str) -> int:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, target).history(1).first().version)


def test_additive_changes_land_with_their_batch_and_others_stop_before_anything_is_written(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str) -> None:
    topic = topic_factory("evolve")
    target = f"{table_root}/orders"
    ledger = Ledger(spark, f"{target}_tidemark_ledger", "orders")

    _produce(kafka_bootstrap, topic, [{"id": i, "note": f"v1-{i}"} for i in range(5)])
    assert _ingest(spark, kafka_bootstrap, topic, target, "id INT, note STRING").rows == 5
    v1 = _version(spark, target)

    # A new field and a widening: stopped until the pipeline opts into the widening, nothing written;
    # then the batch's commit carries the new schema, its rows and its offsets.
    _produce(kafka_bootstrap, topic, [{"id": 2**40 + i, "note": f"v2-{i}", "extra": f"x{i}"} for i in range(5)])
    with pytest.raises(SchemaConflictError, match=r"field id is int in the table and bigint .*type_widening: allow"):
        _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, note STRING, extra STRING")
    assert _version(spark, target) == v1
    assert _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, note STRING, extra STRING",
                   type_widening="allow").rows == 5
    table = spark.read.format("delta").load(target)
    assert {f.name: f.dataType.simpleString() for f in table.schema.fields if not f.name.startswith("_")} == {
        "id": "bigint", "note": "string", "extra": "string"}
    rows = {r.id: r.extra for r in table.select("id", "extra").collect()}
    assert rows == {**{i: None for i in range(5)}, **{2**40 + i: f"x{i}" for i in range(5)}}
    v2 = _version(spark, target)
    commit = _log_entry(target, v2)
    kinds = {next(iter(a)) for a in commit}
    assert {"metaData", "txn", "add"} <= kinds, kinds  # one commit: schema, offsets and rows
    assert next(a["txn"] for a in commit if "txn" in a)["version"] == ledger.last().batch_id  # type: ignore[union-attr]
    # Read back one version at a time: the earlier version keeps its own schema and rows.
    before = spark.read.format("delta").option("versionAsOf", v1).load(target)
    assert "extra" not in before.columns and before.count() == 5
    assert dict(before.dtypes)["id"] == "int"
    # Type widening changed no data file: the v1 rows read back as bigint.
    assert sorted(r.id for r in table.where("id < 5").collect()) == list(range(5))

    # A removed field keeps its column, null from then on.
    _produce(kafka_bootstrap, topic, [{"id": 100 + i, "note": "dropped", "extra": "y"} for i in range(3)])
    assert _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, extra STRING").rows == 3
    table = spark.read.format("delta").load(target)
    assert "note" in table.columns
    assert [r.note for r in table.where("id >= 100 and id < 200").collect()] == [None] * 3

    # An incompatible change: one clear stop, nothing claimed, nothing written.
    _produce(kafka_bootstrap, topic, [{"id": 200 + i, "extra": "z"} for i in range(2)])
    claimed, version = ledger.last().batch_id, _version(spark, target)  # type: ignore[union-attr]
    with pytest.raises(SchemaConflictError, match=r"field extra is string in the table and int in the batch"):
        _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, extra INT")
    # strict: even an addition stops.
    with pytest.raises(SchemaConflictError, match="strict"):
        _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, extra STRING, more STRING",
                schema_evolution="strict")
    assert ledger.last().batch_id == claimed and _version(spark, target) == version  # type: ignore[union-attr]

    # The operator puts the type back: the pipeline goes on, every record exactly once.
    assert _ingest(spark, kafka_bootstrap, topic, target, "id BIGINT, extra STRING").rows == 2
    assert_exactly_once(spark, target, kafka_bootstrap, [topic])


@pytest.mark.slow
def test_a_crash_between_claim_and_commit_changes_the_schema_once(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, tmp_path: Path) -> None:
    """`tidemark ingest` SIGKILLed after claiming a batch that adds a column: the next run's replay
    writes the rows and the schema change in one commit, once."""
    topic = topic_factory("evolve-crash", partitions=2)
    target = f"{table_root}/orders"
    config = tmp_path / "tidemark.yaml"

    def run(schema: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
        write_config(config, kafka_bootstrap, target, topics=[topic], schema=schema)
        return subprocess.run(ingest_argv(config), env=process_env(crash_at), capture_output=True, text=True,
                              timeout=600, check=False)

    _produce(kafka_bootstrap, topic, [{"id": i, "note": "v1"} for i in range(20)], partitions=2)
    assert run("id BIGINT, note STRING").returncode == 0
    _produce(kafka_bootstrap, topic, [{"id": 100 + i, "note": "v2", "extra": f"e{i}"} for i in range(20)],
             partitions=2)
    crashed = run("id BIGINT, note STRING, extra STRING", crash_at="claimed")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "extra" not in spark.read.format("delta").load(target).columns  # claimed, not committed

    done = run("id BIGINT, note STRING, extra STRING")
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(spark, target, kafka_bootstrap, [topic])
    table = spark.read.format("delta").load(target)
    assert sorted(r.extra for r in table.where("id >= 100").collect()) == sorted(f"e{i}" for i in range(20))
    # The schema changed in exactly one commit, the one that holds the batch's rows.
    from tests.conftest import on_disk

    changes = [v for v in range(_version(spark, target) + 1)
               if (on_disk(target) / "_delta_log" / f"{v:020d}.json").exists()
               and any("metaData" in a for a in _log_entry(target, v))]
    assert len(changes) == 2, changes  # the table's creation, then the batch that added `extra`
    assert any("add" in a for a in _log_entry(target, changes[1]))

    # An incompatible edit through the CLI: one line naming the field and both types, exit 78.
    refused = run("id BIGINT, note STRING, extra INT")
    assert refused.returncode == 78, refused.stderr[-2000:]
    lines = [line for line in refused.stderr.splitlines() if line.startswith("tidemark:")]
    assert len(lines) == 1 and "field extra is string in the table and int in the batch" in lines[0], refused.stderr
