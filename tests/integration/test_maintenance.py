"""`tidemark maintain` on real Kafka, Spark and Delta: compaction and VACUUM keep every
version inside the time-travel promise readable, stored batches still backfill bit for
bit once the files they were first written to are gone (G6), and a retention shorter
than the promise is refused before anything is touched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from offsets.ledger import Ledger
from orchestration.context import PipelineContext
from orchestration.status import pipeline_status
from pipelines.backfill import Backfill
from pipelines.ingest import IngestJob
from pipelines.maintain import maintain
from tests.ingest_harness import table_keys, write_config
from tests.kafka_helpers import read_all, transactional_producer, write_transaction
from tidemark.config import parse_config
from tidemark.errors import ConfigError

BAD = b"\xff not json"


def _config(tmp: Path, bootstrap: str, topic: str, **extra: object):  # type: ignore[no-untyped-def]
    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "orders", "topics": [topic], "target": str(tmp / "orders"), "schema": "id BIGINT, note STRING",
         "max_records_per_batch": 25, **extra}]})
    return config, config.pipelines[0]


def _rows(spark, path: str, version: int | None = None) -> list[tuple]:  # type: ignore[no-untyped-def]
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(path)
    return sorted(tuple(r) for r in df.select(*sorted(df.columns)).collect())


def _version(spark, path: str) -> int:  # type: ignore[no-untyped-def]
    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


def _parquet_files(path: str) -> int:
    return sum(1 for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts)


def test_maintain_compacts_keeps_the_promise_and_backfill_still_reproduces(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory("maintain", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(6):
        values = [json.dumps({"id": i, "note": f"n{i}"}).encode() for i in range(t * 20, t * 20 + 20)]
        write_transaction(producer, topic, values + ([BAD] if t % 2 else []), commit=t != 2)
    config, pipeline = _config(tmp_path, kafka_bootstrap, topic)
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    batches = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert len(batches) >= 4

    # New tables carry the promise as Delta properties.
    props = DeltaTable.forPath(spark, pipeline.target).detail().first()["properties"]
    assert props["delta.deletedFileRetentionDuration"] == "interval 168 hours"
    assert props["delta.logRetentionDuration"] == "interval 168 hours"

    before, first_version = _rows(spark, pipeline.target), _version(spark, pipeline.target)
    files_before = _parquet_files(pipeline.target)
    report = maintain(spark, pipeline)
    target = report.tables[0]
    assert target.role == "target" and target.files_before >= len(batches)  # small files, one or two per batch
    assert target.files_after == 1 and target.compacted_away == target.files_before
    assert report.tables[2].role == "ledger" and report.tables[2].files_after == 1
    assert target.vacuumed == 0 and _parquet_files(pipeline.target) == files_before + 1  # inside the promise
    assert _rows(spark, pipeline.target) == before
    assert _rows(spark, pipeline.target, first_version) == before  # time travel to before the compaction
    assert _rows(spark, pipeline.target, 0)  # the oldest version too

    status = pipeline_status(PipelineContext(config, pipeline, kafka_bootstrap), tmp_path / "quality")
    shape = status.tables["target"]
    assert (shape.files, shape.version, shape.oldest_readable_version) == (1, target.version, 0)
    assert status.maintained.startswith(report.finished_at or "?") and set(status.tables) == {
        "target", "quarantine", "ledger"}
    assert target.retain_hours == 168

    # A table whose retention is shorter than the promise is refused before anything happens.
    spark.sql(f"ALTER TABLE delta.`{pipeline.target}` SET TBLPROPERTIES "
              "('delta.deletedFileRetentionDuration' = 'interval 1 hours')")
    altered = _version(spark, pipeline.target)
    with pytest.raises(ConfigError, match="'interval 1 hours' is shorter than this pipeline's promise"):
        maintain(spark, pipeline)
    assert _version(spark, pipeline.target) == altered

    # A promise of zero hours: VACUUM deletes what compaction replaced, so old versions are gone...
    _, zero = _config(tmp_path, kafka_bootstrap, topic, maintenance={"time_travel_hours": 0})
    again = maintain(spark, zero, apply_properties=True)
    assert again.tables[0].vacuumed == files_before and _parquet_files(pipeline.target) == 1
    with pytest.raises(Exception, match="(?i)file"):
        _rows(spark, pipeline.target, first_version)
    assert _rows(spark, pipeline.target) == before
    status = pipeline_status(PipelineContext(config, zero, kafka_bootstrap), tmp_path / "quality")
    assert status.tables["target"].oldest_readable_version > first_version

    # ...and every stored batch still backfills from Kafka, bit for bit (G6).
    into = str(tmp_path / "rebuilt")
    rebuilt = Backfill(spark, config, pipeline, kafka_bootstrap, into).stored_batches(1, batches[-1].batch_id)
    assert len(rebuilt.batches) == len(batches)
    assert _rows(spark, into) == before
    assert _rows(spark, into + "_quarantine") == _rows(spark, pipeline.quarantine_path)
    _assert_exactly_once(spark, pipeline, kafka_bootstrap, topic)

    # The pipeline goes on after maintenance: new batches append to the compacted tables.
    write_transaction(producer, topic, [json.dumps({"id": 500, "note": "later"}).encode()], commit=True)
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    _assert_exactly_once(spark, pipeline, kafka_bootstrap, topic)


def _assert_exactly_once(spark, pipeline, bootstrap: str, topic: str) -> None:  # type: ignore[no-untyped-def]
    """Every read_committed record once: the good ones in the target, the bad ones in quarantine."""
    records = read_all(bootstrap, topic)
    bad = sorted((topic, r.partition, r.offset) for r in records if r.value == BAD)
    assert bad, "the test wrote no bad records"
    assert table_keys(spark, pipeline.target) == sorted(
        (topic, r.partition, r.offset) for r in records if r.value != BAD)
    assert _quarantine_keys(spark, pipeline.quarantine_path) == bad


def _quarantine_keys(spark, path: str) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("delta").load(path).select("topic", "partition", "offset").collect()
    return sorted((r[0], r[1], r[2]) for r in rows)


def test_a_retention_shorter_than_the_promise_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vacuum_retain_hours 24 is shorter than time_travel_hours 48"):
        parse_config({"pipelines": [{"name": "orders", "topics": ["t"], "target": str(tmp_path / "t"),
                                     "format": "raw", "maintenance": {"time_travel_hours": 48,
                                                                      "vacuum_retain_hours": 24}}]})
    config = write_config(tmp_path / "tidemark.yaml", "127.0.0.1:1", tmp_path / "orders", topics=["t"],
                          maintenance={"time_travel_hours": 48, "vacuum_retain_hours": 12})
    done = subprocess.run([sys.executable, "-m", "tidemark.cli", "maintain", "orders", "--config", str(config)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert "vacuum_retain_hours 12 is shorter than time_travel_hours 48" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "orders").exists()  # refused before Spark started: nothing touched


def test_backfill_refuses_a_dedup_batch_whose_table_version_was_vacuumed(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory("maintain-dedup", partitions=1)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(3):
        write_transaction(producer, topic, [json.dumps({"id": i, "note": "d"}).encode() for i in range(t * 10, t * 10 + 10)],
                          commit=True)
    config, pipeline = _config(tmp_path, kafka_bootstrap, topic, dedup={}, event_id="field:id",
                               maintenance={"time_travel_hours": 0})
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    batches = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert [b.dedup_version for b in batches][:2] == [-1, 0]
    maintain(spark, pipeline)  # compaction, then VACUUM with a zero-hour promise: version 0's files go

    with pytest.raises(ConfigError, match="cannot be reproduced bit for bit"):
        Backfill(spark, config, pipeline, kafka_bootstrap, str(tmp_path / "again")).stored_batches(1, 2)
    assert not (tmp_path / "again").exists()
    # Batch 1 looked nothing up (no table yet): it still backfills, exactly.
    Backfill(spark, config, pipeline, kafka_bootstrap, str(tmp_path / "first")).stored_batches(1, 1)
    expected = spark.read.format("delta").load(pipeline.target).where("_tidemark_batch_id = 1")
    assert _rows(spark, str(tmp_path / "first")) == sorted(
        tuple(r) for r in expected.select(*sorted(expected.columns)).collect())
