"""G3 catching up on a relay-written backlog under a record cap, on real PostgreSQL, relay,
Kafka, Spark and Delta: every batch makes progress, none commits an empty version, a
bounded run ends, and every version holds whole source transactions.

The backlog is uneven across the three topics (one takes most events), so a capped
proposal ends at very different points in time per partition: the case where a cut from
the manifest, its read's early stop and a revision by the scan must agree.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.ingest import IngestJob
from tests import g3_checks as g3
from tests.relay_harness import RelaySetup, Writers
from tidemark.config import TidemarkConfig, parse_config

pytestmark = pytest.mark.slow

#: Most events go to the first topic, few to the last.
WEIGHTS = (6, 3, 1)


def _config(setup: RelaySetup, target: Path, cap: int) -> TidemarkConfig:
    pattern = setup.prefix.replace(".", r"\.") + r"\.(order|payment|shipment)"
    return parse_config({"kafka": {"bootstrap_servers": setup.bootstrap}, "pipelines": [{
        "name": target.name, "topic_pattern": pattern, "target": str(target), "schema": "key STRING, seq BIGINT",
        "event_id": "header:id", "dedup": {}, "max_records_per_batch": cap,
        "transactions": {"manifest_topic": setup.manifest_topic, "incomplete_timeout_seconds": 30}}]})


def _backlog(tmp: Path, dsn: str, bootstrap: str, events: int, seed: int) -> RelaySetup:
    """A relay's topics holding at least ``events`` events of 1-20-event source transactions,
    unevenly over its three topics, written while no follower runs."""
    setup = RelaySetup.create(tmp, dsn, bootstrap)
    writers = Writers(setup, threads=4, late_rate=0.2, rollback_rate=0.15, weights=WEIGHTS, seed=seed).start()
    deadline = time.monotonic() + 120
    while sum(len(t.events) for t in list(writers.committed)) < events and time.monotonic() < deadline:
        time.sleep(0.5)
    writers.stop()
    setup.drain()
    return setup


@pytest.mark.parametrize(("events", "caps"), [(5_000, (200, 1000)), (2_000, (50,))],
                         ids=["5k-cap200-cap1000", "2k-cap50"])
def test_capped_followers_catch_up_on_an_uneven_backlog_whole_and_without_empty_versions(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path, events: int,  # type: ignore[no-untyped-def]
        caps: tuple[int, ...]) -> None:
    """Each cap catches up in at most 2 * ceil(N / cap) + 5 batches. (The cap of 50 runs on a
    smaller backlog: at 5,000 events it would be 100-odd batches of a few seconds each.)"""
    setup = _backlog(tmp_path, postgres_dsn, kafka_bootstrap, events, seed=11 + len(caps))
    written, offsets = g3.written(setup)
    total = sum(written.values())
    assert total >= events and sum(1 for n in written.values() if n > 1) > events // 20, (total, len(written))

    for cap in caps:
        config = _config(setup, tmp_path / f"cap{cap}", cap)
        limit = 2 * math.ceil(total / cap) + 5
        job = IngestJob(spark, config, config.pipelines[0], kafka_bootstrap)
        done: list[int] = []

        def count(result: Any, seconds: float, limit: int = limit, done: list[int] = done, cap: int = cap) -> None:
            done.append(result.rows)
            if len(done) > limit:  # a run that loops is stopped here, not by the test's timeout
                raise AssertionError(f"cap {cap}: {len(done)} batches for {total} events (at most {limit}); "
                                     f"the last ones landed {done[-5:]} rows")

        job.on_batch = count
        report = job.run_bounded()
        assert report.rows == total, f"cap {cap}: {report.summary()}"
        batches = g3.assert_whole_and_progressing(spark, config.pipelines[0], written, offsets)
        assert batches <= limit, f"cap {cap}: {batches} batches for {total} events"


def test_a_capped_follower_keeps_up_with_the_relay_at_full_speed(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap)
    relay = setup.start()
    config = _config(setup, tmp_path / "follower", 500)
    job = IngestJob(spark, config, config.pipelines[0], kafka_bootstrap)
    stop = threading.Event()
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            job.follow(stop)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    writers = Writers(setup, threads=4, late_rate=0.2, rollback_rate=0.15, weights=WEIGHTS, seed=12).start()
    follower.start()
    try:
        time.sleep(15)
        writers.stop()
        setup.catch_up_and_stop(relay)
        written, offsets = g3.written(setup)
        deadline = time.monotonic() + 300
        target = config.pipelines[0].target
        while time.monotonic() < deadline and not failure:
            if g3.table_rows(spark, target) >= len(offsets):
                break
            time.sleep(2)
    finally:
        stop.set()
        follower.join(120)
    assert not failure, f"the follower failed: {failure[0]!r}"
    assert sum(written.values()) > 1000
    g3.assert_whole_and_progressing(spark, config.pipelines[0], written, offsets)
