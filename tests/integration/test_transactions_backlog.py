"""G3 on a relay-written backlog older than the incomplete-timeout, on real
PostgreSQL, relay, Kafka, Spark and Delta.

A transaction the record cap splits is whole in Kafka, however old its events: it must
wait for a later batch, never be released. Only one whose events are missing below the
LSO (here: deleted by retention before the pipeline read them) is released, after the
timeout counted from the first batch that found them missing, flagged and alerted.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from offsets.ledger import Ledger
from outbox import wire
from outbox.schema import add_event
from pipelines.ingest import IngestJob
from tests.relay_harness import AGGREGATES, RelaySetup, Writers, header
from tidemark.config import TidemarkConfig, parse_config

TIMEOUT = 2.0


def _config(setup: RelaySetup, target: Path, cap: int, timeout: float = TIMEOUT) -> TidemarkConfig:
    pattern = setup.prefix.replace(".", r"\.") + r"\.(order|payment|shipment)"
    return parse_config({"kafka": {"bootstrap_servers": setup.bootstrap}, "pipelines": [{
        "name": "events", "topic_pattern": pattern, "target": str(target), "schema": "key STRING, seq BIGINT",
        "max_records_per_batch": cap, "transactions": {"incomplete_timeout_seconds": timeout}}]})


def _by_version(spark: Any, target: str) -> dict[int, dict[str, tuple[int, int, bool]]]:
    """Per table version: per source transaction (rows, expected, released)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    out = {}
    versions = [int(r.version) for r in DeltaTable.forPath(spark, target).history().select("version").collect()]
    for version in sorted(versions):
        rows = (spark.read.format("delta").option("versionAsOf", version).load(target)
                .where("_tidemark_txn IS NOT NULL").groupBy("_tidemark_txn.id")
                .agg(F.count(F.lit(1)), F.max("_tidemark_txn.expected"), F.max("_tidemark_txn.released")).collect())
        out[version] = {r[0]: (int(r[1]), int(r[2]), bool(r[3])) for r in rows}
    return out


def _txn_ids(setup: RelaySetup) -> dict[str, int]:
    """Per source transaction in the topics (``lsn/txid``): its events there."""
    return dict(Counter(f"{header(r, wire.LSN)}/{header(r, wire.TXID)}" for r in setup.records()))


def test_a_backlog_older_than_the_timeout_lands_whole_under_a_small_cap(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap)
    writers = Writers(setup, threads=2, pause=0.02, late_rate=0.2, rollback_rate=0.15).start()
    time.sleep(1.5)
    writers.stop()
    setup.drain()
    written = _txn_ids(setup)
    assert len(written) >= 20 and any(n > 1 for n in written.values()), written
    time.sleep(TIMEOUT + 1)  # every event is now older than the timeout

    config = _config(setup, tmp_path / "events", cap=max(60, sum(written.values()) // 6))
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert len(report.batches) >= 3

    intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert not any(i.released for i in intents), [i.released for i in intents if i.released]
    assert sum(i.held for i in intents) > 0, "the cap split no transaction: the test proves less than it claims"
    assert not any(i.waiting for i in intents), "a transaction whole in Kafka was taken for one missing events"
    versions = _by_version(spark, pipeline.target)
    for version, txns in versions.items():
        for txn, (rows, expected, released) in txns.items():
            assert rows == expected == written[txn] and not released, f"version {version}: {txn} {rows}/{expected}"
    assert {t: n for t, (n, _, _) in versions[max(versions)].items()} == written


def test_only_a_transaction_missing_events_below_the_lso_is_released_after_the_timeout(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap)
    with setup.connect() as conn:
        with conn.cursor() as cur:  # the victim: first in every partition it writes to
            for seq, aggregate in enumerate(AGGREGATES * 2):
                add_event(cur, aggregate, f"victim-{seq}", "Changed", {"key": "victim", "seq": seq},
                          table=setup.table)
        conn.commit()
        for n in range(12):  # then others, on the same topics
            with conn.cursor() as cur:
                for i in range(3):
                    add_event(cur, AGGREGATES[(n + i) % 3], f"k-{n}-{i}", "Changed", {"key": f"k{n}", "seq": i},
                              table=setup.table)
            conn.commit()
    setup.drain()
    records = setup.records()
    victim = {f"{header(r, wire.LSN)}/{header(r, wire.TXID)}" for r in records if (r.key or b"").startswith(b"victim-")}
    assert len(victim) == 1
    victim_id = victim.pop()
    # Retention takes the victim's events in one partition (they are its first records) and nothing else.
    mine: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in records:
        if f"{header(r, wire.LSN)}/{header(r, wire.TXID)}" == victim_id:
            mine[(r.topic, r.partition)].append(r.offset)
    (topic, partition), offsets = min(mine.items())
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # alive until the futures complete
    for future in admin.delete_records([TopicPartition(topic, partition, max(offsets) + 1)]).values():
        future.result(30)
    lost = len(offsets)
    written = _txn_ids(setup)
    assert written[victim_id] == 6 - lost and len(written) == 13

    # All of it is older than the timeout, yet the wait starts now. A first run that cannot
    # reach the timeout (a cold batch takes longer than a short one) proves the wait began.
    config = _config(setup, tmp_path / "events", cap=1000, timeout=3600)
    pipeline = config.pipelines[0]
    caplog.set_level(logging.INFO, logger="pipelines.transactions")
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    ledger = Ledger(spark, pipeline.ledger_path, pipeline.name)
    first = ledger.last()
    assert first is not None and set(first.waiting) == {victim_id} and not first.released
    assert not [r for r in caplog.records if "ALERT" in r.getMessage()]

    time.sleep(TIMEOUT + 1)
    config = _config(setup, tmp_path / "events", cap=1000)
    IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded()
    intents = ledger.history()
    assert [i.released for i in intents if i.released] == [(victim_id,)]
    assert not intents[-1].waiting
    alerts = [r.getMessage() for r in caplog.records if "ALERT" in r.getMessage()]
    assert len(alerts) == 1 and victim_id in alerts[0] and "releasing 1 source transaction" in alerts[0], alerts
    final = _by_version(spark, pipeline.target)
    last = final[max(final)]
    assert last.pop(victim_id) == (6 - lost, 6, True)
    assert all(rows == expected and not released for rows, expected, released in last.values())
    assert {t: n for t, (n, _, _) in last.items()} == {t: n for t, n in written.items() if t != victim_id}
    for version, txns in final.items():  # before the release, every version held whole transactions only
        for txn, (rows, expected, released) in txns.items():
            assert rows == expected or (txn == victim_id and released), (version, txn, rows, expected)


def test_the_manifest_cut_equals_the_scan_cut_version_by_version_with_no_scan(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pipelines.transactions import consumers as pool
    from pipelines.transactions import manifest_records, plan

    # Small groups: many manifest records, most of them inside a batch (read from their summary).
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, group={"max_transactions": 1})
    writers = Writers(setup, threads=2, pause=0.02, late_rate=0.2, rollback_rate=0.15, seed=9).start()
    time.sleep(1.2)
    writers.stop()
    setup.drain()
    written = _txn_ids(setup)
    pattern = setup.prefix.replace(".", r"\.") + r"\.(order|payment|shipment)"

    def config(name: str, **g3: Any) -> TidemarkConfig:
        return parse_config({"kafka": {"bootstrap_servers": setup.bootstrap}, "pipelines": [{
            "name": name, "topic_pattern": pattern, "target": str(tmp_path / name), "schema": "key STRING, seq BIGINT",
            "max_records_per_batch": max(60, sum(written.values()) // 5), "transactions": g3}]})

    scans = []
    real_scan = plan.scan
    monkeypatch.setattr(plan, "scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    consumers: list[str] = []
    real_consumer = pool.manifest_consumer
    monkeypatch.setattr(pool, "manifest_consumer",
                        lambda config, isolation: consumers.append(isolation) or real_consumer(config, isolation))
    summaries: list[object] = []
    real_summarized = manifest_records._summarized
    monkeypatch.setattr(manifest_records, "_summarized",
                        lambda *a: summaries.append(found := real_summarized(*a)) or found)
    by_manifest = config("manifest", manifest_topic=setup.manifest_topic)
    pool.ManifestConsumers.close_idle()  # none kept from an earlier test's runs
    IngestJob(spark, by_manifest, by_manifest.pipelines[0], kafka_bootstrap).run_bounded()
    assert scans == [], "the manifest path read the records' headers"
    # Records inside a batch were read from their summary header, the others decoded.
    assert any(summaries) and not all(summaries), summaries
    # The run's batches read the manifest with the same two consumers (ManifestConsumers).
    assert sorted(consumers) == ["read_committed", "read_uncommitted"], consumers
    by_scan = config("scanned", manifest_topic=None, scan="always")
    IngestJob(spark, by_scan, by_scan.pipelines[0], kafka_bootstrap).run_bounded()
    assert scans, "the scan path did not scan"

    plans = Ledger(spark, by_manifest.pipelines[0].ledger_path, "manifest").history()
    assert len(plans) >= 3 and all(i.manifest is not None and i.guarded for i in plans)
    assert sum(i.held for i in plans) > 0, "the cap split no transaction: the test proves less than it claims"
    scanned = Ledger(spark, by_scan.pipelines[0].ledger_path, "scanned").history()
    assert [i.ranges for i in plans] == [i.ranges for i in scanned]

    def offsets(name: str) -> dict[int, set[tuple[str, int, int]]]:
        from delta.tables import DeltaTable

        target = str(tmp_path / name)
        versions = [int(r.version) for r in DeltaTable.forPath(spark, target).history().select("version").collect()]
        return {v: {(r[0], r[1], r[2]) for r in spark.read.format("delta").option("versionAsOf", v).load(target)
                    .select("_kafka_topic", "_kafka_partition", "_kafka_offset").collect()} for v in versions}

    assert offsets("manifest") == offsets("scanned")
    for version, txns in _by_version(spark, str(tmp_path / "manifest")).items():
        for txn, (rows, expected, released) in txns.items():
            assert rows == expected == written[txn] and not released, f"version {version}: {txn}"
