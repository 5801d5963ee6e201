"""Recovery of the ingest under real operating conditions, on real Kafka, Spark
and Delta: other writers' commits on the target, a lost ledger, ``start: latest`` under
live traffic, partitions that appear while a pipeline follows its topics.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from connectors.topic_reader import read_to_end
from offsets.ledger import Ledger, LedgerMismatchError
from offsets.tables import delta_table_exists
from pipelines.ingest import IngestJob
from tidemark.config import TidemarkConfig, parse_config


def _config(bootstrap: str, target: Path, topics: list[str], **extra: Any) -> TidemarkConfig:
    return parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "events", "topics": topics, "target": str(target), "schema": "n BIGINT", **extra}]})


def _produce(bootstrap: str, topic: str, ns: range, partition: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in ns:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=json.dumps({"n": n}).encode(), key=str(n).encode(), **kwargs)
    producer.flush(30)


def _ns(spark: Any, target: Path) -> list[int]:
    return sorted(r[0] for r in spark.read.format("delta").load(str(target)).select("n").collect())


def _ingested(spark: Any, bootstrap: str, topic: str, target: Path, records: int) -> tuple[TidemarkConfig, Any]:
    """A pipeline over ``topic`` that has ingested its first ``records`` records."""
    _produce(bootstrap, topic, range(records))
    config = _config(bootstrap, target, [topic])
    IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
    return config, config.pipelines[0]


def test_recovery_finds_its_batch_behind_60_foreign_commits_after_retention(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("foreign", partitions=1)
    config, pipeline = _ingested(spark, kafka_bootstrap, topic, tmp_path / "events", 20)
    for n in range(60):  # another writer's commits (table maintenance, a second pipeline)
        spark.sql(f"ALTER TABLE delta.`{pipeline.target}` SET TBLPROPERTIES ('foreign.commit' = '{n}')")
    # Retention then deletes the batch's records: a replay could not read them any more.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(30)

    _produce(kafka_bootstrap, topic, range(20, 25))
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert [b.replayed for b in report.batches] == [False], [(b.intent.batch_id, b.replayed) for b in report.batches]
    assert _ns(spark, tmp_path / "events") == list(range(25))
    assert not delta_table_exists(spark, pipeline.quarantine_path)  # no bad record, no quarantine table


def test_a_batch_being_recovered_is_logged_with_its_ranges_and_shown_by_status(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """A run that fails after its claim leaves a batch the target lacks: status says so, and the
    next run logs that it recovers it, with its id and ranges, before it writes it again (a
    replay under load can take minutes; a run that says nothing meanwhile looks idle)."""
    import logging

    from offsets.protocol import InjectedFault
    from orchestration.context import PipelineContext
    from orchestration.status import pipeline_status

    topic = topic_factory("recovering", partitions=2)
    config, pipeline = _ingested(spark, kafka_bootstrap, topic, tmp_path / "events", 10)
    _produce(kafka_bootstrap, topic, range(10, 25))
    monkeypatch.setenv("TIDEMARK_RAISE_AT", f"claimed:{pipeline.name}")
    with pytest.raises(InjectedFault):
        IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    monkeypatch.delenv("TIDEMARK_RAISE_AT")
    status = pipeline_status(PipelineContext(config, pipeline, kafka_bootstrap), tmp_path / "quality")
    assert status.last_batch.startswith("#2 ") and "not in the target yet" in status.last_batch, status.last_batch
    caplog.set_level(logging.INFO, logger="offsets.protocol")
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    lines = [r.getMessage() for r in caplog.records if "recovering it" in r.getMessage()]
    assert len(lines) == 1 and "batch 2" in lines[0] and "15 offsets in 2 partition(s)" in lines[0], lines
    assert f"{topic}[0]" in lines[0] and f"{topic}[1]" in lines[0], lines
    assert _ns(spark, tmp_path / "events") == list(range(25))
    status = pipeline_status(PipelineContext(config, pipeline, kafka_bootstrap), tmp_path / "quality")
    assert "not in the target" not in status.last_batch, status.last_batch


def test_a_deleted_ledger_stops_the_pipeline_instead_of_skipping_records(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("noledger", partitions=2)
    config, pipeline = _ingested(spark, kafka_bootstrap, topic, tmp_path / "events", 10)
    shutil.rmtree(pipeline.ledger_path)
    _produce(kafka_bootstrap, topic, range(10, 15))
    with pytest.raises(LedgerMismatchError, match="holds batch 1, but its ledger .* is missing or empty"):
        IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _ns(spark, tmp_path / "events") == list(range(10))
    assert not Path(pipeline.ledger_path).exists()


def test_start_latest_under_live_traffic_then_a_partition_added_while_following(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("latest", partitions=2)
    _produce(kafka_bootstrap, topic, range(100))  # before the pipeline: never ingested
    stop, counter = threading.Event(), iter(range(100, 1_000_000))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 0})

    def traffic() -> None:
        while not stop.is_set():
            producer.produce(topic, value=json.dumps({"n": next(counter)}).encode())
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)

    writer = threading.Thread(target=traffic, daemon=True)
    writer.start()
    while sum(1 for _ in read_to_end(kafka_bootstrap, topic)) < 300:  # records arriving all the time
        time.sleep(0.2)
    config = _config(kafka_bootstrap, tmp_path / "events", [topic], start="latest", trigger_interval_seconds=0.5)
    pipeline = config.pipelines[0]
    try:
        IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()  # raised OffsetRegressionError
    finally:
        stop.set()
        writer.join(30)
    first = Ledger(spark, pipeline.ledger_path, pipeline.name).get(1)
    assert first is not None
    starts = {r.partition: r.start for r in first.ranges}

    # A third partition appears with records before the follower sees it: all of them are the pipeline's.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
        future.result(30)
    _produce(kafka_bootstrap, topic, range(-5, 0), partition=2)
    follower_stop = threading.Event()
    follower = threading.Thread(target=lambda: IngestJob(spark, config, pipeline, kafka_bootstrap).follow(
        follower_stop), daemon=True)
    follower.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not set(range(-5, 0)) <= set(_ns(spark, tmp_path / "events")):
            time.sleep(1)
    finally:
        follower_stop.set()
        follower.join(120)
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    expected = sorted(json.loads(r.value)["n"] for r in read_to_end(kafka_bootstrap, topic)
                      if r.partition == 2 or r.offset >= starts[r.partition])
    assert _ns(spark, tmp_path / "events") == expected
    assert set(range(-5, 0)) <= set(expected) and not set(range(100)) & set(expected)
