"""`tidemark ingest` as real processes: `--follow` stops cleanly on SIGTERM, and two runs of
one pipeline at once never both commit a batch."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from offsets.ledger import Ledger
from tests.ingest_harness import (
    BackgroundProducer,
    Pipeline,
    assert_exactly_once,
    ingest_argv,
    process_env,
    run_ingest,
    target_commits_per_batch,
)

# Several JVM start-ups and a few minutes of producing each: the slow stage.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _start_follow(config: Path, log: Path) -> subprocess.Popen[str]:
    """`ingest --follow` with its output in a file (a pipe could fill up and stall it)."""
    with log.open("w") as sink:
        return subprocess.Popen(ingest_argv(config, "--follow"), env=process_env(), text=True,
                                stdout=sink, stderr=subprocess.STDOUT)


def _wait_for_batches(ledger: Ledger, proc: subprocess.Popen[str], count: int, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ingest exited early with {proc.returncode}"
        last = ledger.last()
        if last is not None and last.batch_id >= count:
            return last.batch_id
        time.sleep(1)
    raise AssertionError(f"no {count} batches within {timeout:.0f}s")


def test_follow_finishes_the_batch_in_flight_on_sigterm(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                        tmp_path: Path) -> None:
    topic = topic_factory("follow", partitions=2)
    p = Pipeline.create(spark, kafka_bootstrap, topic, tmp_path, max_records_per_batch=300, trigger_interval_seconds=0.5)
    target, config, ledger = p.target, p.config, p.ledger
    producer = BackgroundProducer(kafka_bootstrap, topic, pause=0.1)
    producer.start()
    try:
        proc = _start_follow(config, tmp_path / "follow.log")
        _wait_for_batches(ledger, proc, 3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(180)
    finally:
        producer.stop()
    out = (tmp_path / "follow.log").read_text()
    assert proc.returncode == 0, out[-2000:]
    assert "finishing the batch in flight" in out and "batch(es)" in out
    # Nothing is left half done: the last claimed batch is committed, so no replay is needed.
    last = ledger.last()
    assert last is not None and target_commits_per_batch(spark, str(target))[last.batch_id] == 1
    after = run_ingest(config)
    assert after.returncode == 0 and "replayed" not in after.stderr
    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])


@pytest.mark.s3  # CI runs it in the S3 stage, on s3a:// tables; locally, `pytest -m slow` runs it on local paths
def test_two_concurrent_runs_never_both_commit_a_batch(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                       tmp_path: Path, table_root: str) -> None:
    topic = topic_factory("rivals", partitions=3)
    p = Pipeline.create(spark, kafka_bootstrap, topic, tmp_path, max_records_per_batch=200, trigger_interval_seconds=0.2,
                        root=table_root)
    target, config, ledger = p.target, p.config, p.ledger
    producer = BackgroundProducer(kafka_bootstrap, topic, pause=0.1)
    producer.start()
    try:
        follower = _start_follow(config, tmp_path / "follower.log")
        _wait_for_batches(ledger, follower, 1)
        # A second run starts while the first keeps claiming batches.
        rival = run_ingest(config)
        (tmp_path / "rival.log").write_text(rival.stderr)
        if follower.poll() is None:
            follower.send_signal(signal.SIGTERM)
        follower.wait(180)
    finally:
        producer.stop()
    follower_err = (tmp_path / "follower.log").read_text()
    # Each run either finished (0) or stopped because the other owned the batch (75).
    assert {rival.returncode, follower.returncode} <= {0, 75}, (rival.stderr[-1500:], follower_err[-1500:])
    refused = [e for e in (rival.stderr, follower_err) if "claimed by another run" in e]
    assert run_ingest(config).returncode == 0
    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])
    commits = target_commits_per_batch(spark, str(target))
    assert max(commits.values()) == 1, {b: n for b, n in commits.items() if n > 1}
    intents = ledger.history()
    assert len({i.batch_id for i in intents}) == len(intents), "two intents for one batch id"
    assert sorted(commits) == [i.batch_id for i in intents]  # every claimed batch committed once
    print(f"\nrival exit {rival.returncode}, follower exit {follower.returncode}, refusals {len(refused)}, "
          f"{len(intents)} batches")
