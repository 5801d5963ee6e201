"""Backfill, retention loss and topic discovery on a real broker, Spark and Delta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from connectors.admin import RetentionLossError
from offsets.ledger import Ledger
from pipelines.backfill import Backfill
from pipelines.ingest import IngestJob
from tests.ingest_harness import assert_exactly_once, table_keys
from tests.kafka_helpers import read_all, transactional_producer, write_transaction
from tidemark.config import parse_config


def _config(tmp: Path, bootstrap: str, **source: object):  # type: ignore[no-untyped-def]
    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "orders", "target": str(tmp / "orders"), "schema": "id BIGINT, note STRING", **source}]})
    return config, config.pipelines[0]


def _write(bootstrap: str, topic: str, ids: range, *, commit: bool = True) -> None:
    producer = transactional_producer(bootstrap)
    values = [json.dumps({"id": i, "note": f"n{i}"}).encode() for i in ids]
    write_transaction(producer, topic, values, commit=commit)


def _rows(spark, path: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    df = spark.read.format("delta").load(path)
    return sorted(tuple(r) for r in df.select(*sorted(df.columns)).collect())


def test_backfill_of_stored_batches_reproduces_their_rows(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    topic = topic_factory("backfill", partitions=2)
    for t in range(5):
        _write(kafka_bootstrap, topic, range(t * 20, t * 20 + 20), commit=t != 2)
    config, pipeline = _config(tmp_path, kafka_bootstrap, topics=[topic], max_records_per_batch=30)
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    batches = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert len(batches) >= 3

    into = str(tmp_path / "rebuilt")
    report = Backfill(spark, config, pipeline, kafka_bootstrap, into).stored_batches(2, 3)
    assert [b.intent.batch_id for b in report.batches] == [2, 3]
    source = spark.read.format("delta").load(pipeline.target).where("_tidemark_batch_id IN (2, 3)")
    expected = sorted(tuple(r) for r in source.select(*sorted(source.columns)).collect())
    assert expected and _rows(spark, into) == expected  # same rows, same batch ids, same ingested_at

    again = Backfill(spark, config, pipeline, kafka_bootstrap, into).stored_batches(1, 3)
    assert again.batches == []  # batches 1-3 are at or below what the backfill holds: resumed, nothing new
    assert _rows(spark, into) == expected


def test_backfill_from_offsets_reads_to_the_lso(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                tmp_path: Path) -> None:
    topic = topic_factory("from-offsets", partitions=1)
    _write(kafka_bootstrap, topic, range(10))
    _write(kafka_bootstrap, topic, range(10, 20), commit=False)
    _write(kafka_bootstrap, topic, range(20, 30))
    config, pipeline = _config(tmp_path, kafka_bootstrap, topics=[topic])
    into = str(tmp_path / "tail")
    report = Backfill(spark, config, pipeline, kafka_bootstrap, into).from_offsets({(topic, 0): 5})
    assert report.rows == 15
    expected = sorted((topic, r.partition, r.offset) for r in read_all(kafka_bootstrap, topic) if r.offset >= 5)
    assert table_keys(spark, into) == expected


def test_retention_loss_stops_ingest_and_backfill_with_a_clear_error(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    topic = topic_factory("retention", partitions=1)
    _write(kafka_bootstrap, topic, range(10))
    config, pipeline = _config(tmp_path, kafka_bootstrap, topics=[topic])
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()  # batch 1: offsets [0, 11)
    _write(kafka_bootstrap, topic, range(10, 20))  # offsets [11, 22)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # Retention deletes records the pipeline has not read yet (offsets 11..14) and batch 1's.
    admin.delete_records([TopicPartition(topic, 0, 15)])[TopicPartition(topic, 0, 15)].result(30)
    rows_before = spark.read.format("delta").load(pipeline.target).count()

    with pytest.raises(RetentionLossError, match=rf"{topic}\[0\] wanted 11 but the log starts at 15"):
        IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert spark.read.format("delta").load(pipeline.target).count() == rows_before  # nothing skipped

    into = str(tmp_path / "rebuilt")
    with pytest.raises(RetentionLossError, match=r"\(batch 1\).*wanted 0 but the log starts at 15"):
        Backfill(spark, config, pipeline, kafka_bootstrap, into).stored_batches(1, 1)
    from offsets.tables import delta_table_exists

    assert not delta_table_exists(spark, into)


def test_a_topic_pattern_picks_up_new_topics_and_partitions(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    first = topic_factory("pattern", partitions=1)
    prefix = first.rsplit("-", 1)[0]
    config, pipeline = _config(tmp_path, kafka_bootstrap, topic_pattern=rf"^{prefix}-\d+$")
    _write(kafka_bootstrap, first, range(10))
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert len(table_keys(spark, pipeline.target)) == 10

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(first, 3)])[first].result(30)
    second = f"{prefix}-{int(first.rsplit('-', 1)[1]) + 1000}"
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(second, 2, 1)])[second].result(30)
    producer = transactional_producer(kafka_bootstrap)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(first, value=json.dumps({"id": 100 + i, "note": "new"}).encode(), partition=i % 3)
        producer.produce(second, value=json.dumps({"id": 200 + i, "note": "new"}).encode(), partition=i % 2)
    producer.commit_transaction(30)

    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert report.rows == 60
    last = Ledger(spark, pipeline.ledger_path, pipeline.name).last()
    assert last is not None and {(t, p) for t, p in last.ends()} == {(first, 0), (first, 1), (first, 2),
                                                                      (second, 0), (second, 1)}
    assert_exactly_once(spark, pipeline.target, kafka_bootstrap, [first, second])
