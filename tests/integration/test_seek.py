"""Seeks on real Kafka, Spark and Delta: a pipeline moved back, forward, to a time, past a recreated
topic and past retention's loss goes on under its own name, exactly once by the reconciliation.

The seek runs as the command does (``pipelines.seek.seek``) in the session's Spark; the
ingest between seeks too. The follower under a seek and SIGKILLs during a seek run the real
``tidemark`` processes (the slow tests at the end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from offsets.ledger import Ledger, read_last
from pipelines.ingest import IngestJob
from pipelines.seek import Target, seek
from quality.facts import reconciliation
from tidemark.config import TidemarkConfig, parse_config
from tidemark.errors import ConfigError, TidemarkError


def _config(bootstrap: str, tmp: Path, topic: str, **extra: Any) -> TidemarkConfig:
    return parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [{
        "name": "orders", "topics": [topic], "target": str(tmp / "orders"), "schema": "id BIGINT, note STRING",
        "dedup": {}, "event_id": "field:id", **extra}]})


def _produce(bootstrap: str, topic: str, ids: range, *, partitions: int = 2, at: datetime | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    stamp = {"timestamp": int(at.timestamp() * 1000)} if at else {}
    for i in ids:
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"id": i, "note": f"n{i}"}).encode(),
                         partition=i % partitions,
                         **stamp)
    assert producer.flush(30) == 0


def _ingest(spark: Any, config: TidemarkConfig, bootstrap: str) -> int:
    return IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded().rows


def _ids(spark: Any, path: str) -> list[int]:
    return sorted(r[0] for r in spark.read.format("delta").load(path).select("id").collect())


def _duplicates(spark: Any, path: str) -> int:
    from offsets.tables import delta_table_exists

    if not delta_table_exists(spark, path):
        return 0
    return spark.read.format("delta").load(path).where("error LIKE 'duplicate%'").count()


def _reconciled(spark: Any, config: TidemarkConfig, bootstrap: str) -> list[Any]:
    from connectors.kafka_config import librdkafka_config, spark_options

    pipeline = config.pipelines[0]
    rows = reconciliation(spark, spark_options(config.kafka, bootstrap), librdkafka_config(config.kafka, bootstrap),
                          pipeline).collect()
    assert rows and all(r.difference == 0 for r in rows), rows
    return rows


def test_back_with_reprocess_reads_again_and_dedup_quarantines_every_second_copy(
        spark: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path) -> None:
    topic = topic_factory("seek-back", partitions=2)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    _produce(kafka_bootstrap, topic, range(100))
    assert _ingest(spark, config, kafka_bootstrap) == 100
    before = read_last(pipeline.ledger_path, pipeline.name)
    assert before is not None

    with pytest.raises(ConfigError, match=r"100 offsets would be read again.*--reprocess"):
        seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"))
    assert read_last(pipeline.ledger_path, pipeline.name) == before  # refused: nothing written
    dry = seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"), dry_run=True)
    assert dry.reread == 100 and dry.needs() == ["--reprocess"] and not dry.committed
    assert read_last(pipeline.ledger_path, pipeline.name) == before

    done = seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"), reprocess=True)
    assert done.committed and done.batch_id == before.batch_id + 1
    entry = read_last(pipeline.ledger_path, pipeline.name)
    assert entry is not None and entry.seek is not None and entry.is_empty
    assert entry.ends() == {(topic, 0): 0, (topic, 1): 0}
    assert {(m.old, m.new) for m in entry.seek.moves} == {(50, 0)}

    _produce(kafka_bootstrap, topic, range(100, 120))
    assert _ingest(spark, config, kafka_bootstrap) == 20  # the new events; the 100 again are duplicates
    assert _ids(spark, pipeline.target) == list(range(120))
    assert _duplicates(spark, pipeline.quarantine_path) == 100
    stretches = _reconciled(spark, config, kafka_bootstrap)
    assert {(r.from_offset, r.to_offset, r.reads) for r in stretches} == {(0, 50, 2), (50, 60, 1)}


def test_forward_with_skip_is_recorded_and_reconciled_as_skipped(
        spark: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path) -> None:
    from connectors.kafka_config import librdkafka_config, spark_options
    from quality.audit import audit

    topic = topic_factory("seek-skip", partitions=1)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    _produce(kafka_bootstrap, topic, range(40), partitions=1)
    assert _ingest(spark, config, kafka_bootstrap) == 40
    _produce(kafka_bootstrap, topic, range(40, 100), partitions=1)
    with pytest.raises(ConfigError, match=r"25 offsets would never be read.*--skip"):
        seek(spark, config, pipeline, kafka_bootstrap, Target("shift", shift=25))
    seek(spark, config, pipeline, kafka_bootstrap, Target("shift", shift=25), skip=True)
    assert _ingest(spark, config, kafka_bootstrap) == 35
    assert _ids(spark, pipeline.target) == [*range(40), *range(65, 100)]
    stretches = _reconciled(spark, config, kafka_bootstrap)
    assert {(r.from_offset, r.to_offset, r.reads, r.table_rows) for r in stretches} == {
        (0, 40, 1, 40), (40, 65, 0, 0), (65, 100, 1, 35)}
    report = audit(spark, pipeline, kafka_options=spark_options(config.kafka, kafka_bootstrap),
                   client_config=librdkafka_config(config.kafka, kafka_bootstrap), docs_dir=tmp_path / "docs")
    assert report.passed, [v for v in report.verdicts if not v.passed]
    assert report.skipped == (f"{topic}[0] 40-65 (batch 2, --shift-by 25)",)


def test_a_seek_to_a_time_starts_at_its_first_offset(spark: Any, kafka_bootstrap: str, topic_factory: Any,
                                                     tmp_path: Path) -> None:
    topic = topic_factory("seek-time", partitions=2)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    then = datetime.now(UTC) - timedelta(hours=2)
    _produce(kafka_bootstrap, topic, range(40), at=then)
    _produce(kafka_bootstrap, topic, range(40, 60), at=then + timedelta(hours=1))
    assert _ingest(spark, config, kafka_bootstrap) == 60
    plan = seek(spark, config, pipeline, kafka_bootstrap, Target("timestamp", timestamp=then + timedelta(minutes=30)),
                reprocess=True)
    assert {(m.partition, m.old, m.new) for m in plan.moves} == {(0, 30, 20), (1, 30, 20)}
    assert _ingest(spark, config, kafka_bootstrap) == 0  # the 20 read again are all duplicates
    assert _duplicates(spark, pipeline.quarantine_path) == 20
    _reconciled(spark, config, kafka_bootstrap)


def test_a_recreated_topic_and_lost_records_are_passed_by_seeking_under_the_same_name(
        spark: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path) -> None:
    topic = topic_factory("seek-recreated", partitions=1)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    _produce(kafka_bootstrap, topic, range(50), partitions=1)
    assert _ingest(spark, config, kafka_bootstrap) == 50

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # the broker deletes asynchronously: create again once the name is free
        try:
            admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(30)
            break
        except Exception:  # noqa: BLE001  (TOPIC_ALREADY_EXISTS while the deletion finishes)
            assert time.monotonic() < deadline, "the topic was never deleted"
            time.sleep(0.5)
    _produce(kafka_bootstrap, topic, range(1000, 1030), partitions=1)
    with pytest.raises(TidemarkError, match=r"deleted and recreated.*tidemark offsets seek PIPELINE --to earliest"):
        _ingest(spark, config, kafka_bootstrap)
    plan = seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"))  # nothing to read again or skip
    assert [(m.old, m.new) for m in plan.moves] == [(50, 0)] and plan.planned[0].past_end
    assert _ingest(spark, config, kafka_bootstrap) == 30
    assert _ids(spark, pipeline.target) == [*range(50), *range(1000, 1030)]

    # Then retention deletes records the pipeline has not read yet.
    _produce(kafka_bootstrap, topic, range(1030, 1100), partitions=1)
    from confluent_kafka import TopicPartition

    admin.delete_records([TopicPartition(topic, 0, 60)])[TopicPartition(topic, 0, 60)].result(30)
    with pytest.raises(TidemarkError, match=r"retention.*tidemark offsets seek PIPELINE --to earliest --skip"):
        _ingest(spark, config, kafka_bootstrap)
    with pytest.raises(ConfigError, match="--skip"):
        seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"))
    plan = seek(spark, config, pipeline, kafka_bootstrap, Target("earliest"), skip=True)
    assert [(m.old, m.new) for m in plan.moves] == [(30, 60)] and plan.planned[0].lost == 30
    assert _ingest(spark, config, kafka_bootstrap) == 40
    assert _ids(spark, pipeline.target) == [*range(50), *range(1000, 1030), *range(1060, 1100)]
    assert [i.batch_id for i in Ledger(spark, pipeline.ledger_path, pipeline.name).history() if i.seek] == [2, 4]


# -- the real processes ------------------------------------------------------------------------


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark.cli", *argv], capture_output=True, text=True, timeout=600,
                          check=False, env=env)


def _wait_for(check: Any, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def _ends(ledger: str) -> dict[Any, int]:
    last = read_last(ledger, "orders")
    return last.ends() if last else {}


def _write_yaml(path: Path, config: TidemarkConfig) -> Path:
    import yaml

    pipeline = config.pipelines[0]
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": config.kafka.bootstrap_servers}, "pipelines": [{
        "name": pipeline.name, "topics": list(pipeline.topics), "target": pipeline.target,
        "schema": "id BIGINT, note STRING", "dedup": {}, "event_id": "field:id",
        "trigger_interval_seconds": 1}]}))
    return path


@pytest.mark.slow
def test_a_follower_under_a_seek_loses_no_batch_and_goes_on_from_the_new_offsets(
        spark: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path) -> None:
    topic = topic_factory("seek-follow", partitions=2)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    path = _write_yaml(tmp_path / "tidemark.yaml", config)
    _produce(kafka_bootstrap, topic, range(200))
    follower = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "ingest", "orders", "--follow", "--config", str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: _ends(pipeline.ledger_path) == {(topic, 0): 100, (topic, 1): 100},
                  "the follower to read everything")
        plan = _cli("offsets", "seek", "orders", "--to", "earliest", "--dry-run", "--config", str(path))
        assert plan.returncode == 0, plan.stderr
        assert "would move" in plan.stdout and "(100 offsets read again)" in plan.stdout, plan.stdout
        assert "carrying it out needs --reprocess" in plan.stdout, plan.stdout
        done = _cli("offsets", "seek", "orders", "--to", "earliest", "--reprocess", "--config", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        _produce(kafka_bootstrap, topic, range(200, 230))
        _wait_for(lambda: _duplicates(spark, pipeline.quarantine_path) == 200 and
                  len(_ids(spark, pipeline.target)) == 230, "the follower to read everything again")
        shown = _cli("offsets", "show", "orders", "--config", str(path))
        assert "seek (--to earliest)" in shown.stdout, shown.stdout
    finally:
        follower.send_signal(signal.SIGTERM)
        out, _ = follower.communicate(timeout=120)
    assert follower.returncode == 0, out
    assert _ids(spark, pipeline.target) == list(range(230))  # exactly once, every batch whole
    _reconciled(spark, config, kafka_bootstrap)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["recovered", "claimed"])
def test_a_seek_killed_at_any_step_leaves_the_old_offsets_or_the_new_never_a_mix(
        spark: Any, kafka_bootstrap: str, topic_factory: Any, tmp_path: Path, step: str) -> None:
    topic = topic_factory("seek-kill", partitions=2)
    config = _config(kafka_bootstrap, tmp_path, topic)
    pipeline = config.pipelines[0]
    path = _write_yaml(tmp_path / "tidemark.yaml", config)
    _produce(kafka_bootstrap, topic, range(60))
    assert _ingest(spark, config, kafka_bootstrap) == 60
    before = read_last(pipeline.ledger_path, "orders")
    killed = _cli("offsets", "seek", "orders", "--to", "earliest", "--reprocess", "--config", str(path),
                  env={**os.environ, "TIDEMARK_CRASH_AT": step})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    after = read_last(pipeline.ledger_path, "orders")
    assert after is not None and before is not None
    if step == "recovered":
        assert after == before  # killed before the claim: the old offsets
    else:
        assert after.seek is not None and after.ends() == {(topic, 0): 0, (topic, 1): 0}  # the new, whole
    _produce(kafka_bootstrap, topic, range(60, 70))
    assert _ingest(spark, config, kafka_bootstrap) == 10
    assert _ids(spark, pipeline.target) == list(range(70))
    assert _duplicates(spark, pipeline.quarantine_path) == (0 if step == "recovered" else 60)
    _reconciled(spark, config, kafka_bootstrap)
