"""`tidemark maintain` beside `tidemark ingest --follow`, both SIGKILLed at random instants.

Source transactions spanning two topics (two partitions each) are written as the relay
writes them, with aborted Kafka transactions in between, while ingest follows with small
batches and maintenance compacts and vacuums the same tables. After the rounds of kills
and a final run of each: every version of the target (time travel over all of them,
compaction commits included) holds each source transaction whole or not at all (G3), the
final table is exactly the topics' read_committed records (G1), each batch committed
once, and compaction did land between ingest commits — the concurrency this proves.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from tests.conftest import on_disk, s3_mode
from tests.ingest_harness import (
    delta_versions,
    ingest_argv,
    kafka_keys,
    process_env,
    table_keys,
    target_commits_per_batch,
    wait_for_new_version,
    write_config,
)
from tests.integration.test_transactions import SourceTxns, _txns
from tests.relay_harness import kill_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

#: Rounds of kills: CI runs this on s3a:// only (the S3 stage), with half the rounds for its budget.
ROUNDS = 2 if s3_mode() else 4


class Writer(threading.Thread):
    """Source transactions of 1-5 events over the topics' partitions; every fourth Kafka transaction aborts."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.source = SourceTxns(bootstrap)
        self.partitions = [(t, p) for t in topics for p in (0, 1)]
        self.random = random.Random(5)
        self.stopping = threading.Event()
        self.written = self.aborted = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if self.written % 4 == 3:
                    producer = self.source.producer
                    producer.begin_transaction()
                    producer.produce(self.partitions[0][0], value=b'{"n": -1}', partition=0)
                    producer.flush(30)  # librdkafka#4849: an abort racing the partition's registration fails
                    producer.abort_transaction(30)
                    self.aborted += 1
                events = [self.random.choice(self.partitions) for _ in range(self.random.randint(1, 5))]
                self.source.write(events)
                self.written += 1
                self.stopping.wait(0.3)
        except BaseException as exc:  # noqa: BLE001 (surfaced by stop())
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        assert self.error is None, f"writer failed: {self.error!r}"
        assert self.written > 50 and self.aborted > 10, (self.written, self.aborted)


def _wait_for_compaction(table: str, after: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while True:
        fresh = [f for f in (on_disk(table) / "_delta_log").glob("*.json") if f.stem.isdigit() and int(f.stem) >= after]
        if any('"operation":"OPTIMIZE"' in f.read_text() for f in fresh):
            return
        assert proc.poll() is None, f"maintain exited {proc.returncode}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, "maintain made no compaction in 300 s"
        time.sleep(0.3)


def _maintain_argv(config: Path) -> list[str]:
    return [sys.executable, "-m", "tidemark.cli", "maintain", "events", "--config", str(config)]


@pytest.mark.s3  # CI runs it in the S3 stage, on s3a:// tables; locally, `pytest -m slow` runs it on local paths
def test_maintenance_beside_follow_under_sigkill_keeps_every_version_whole(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path, table_root: str) -> None:
    topics = [topic_factory("maint-a", partitions=2), topic_factory("maint-b", partitions=2)]
    target = f"{table_root}/events"
    config = write_config(tmp_path / "tidemark.yaml", kafka_bootstrap, target, topics=topics, name="events",
                          schema="n BIGINT", max_records_per_batch=100, trigger_interval_seconds=0.5)
    writer = Writer(kafka_bootstrap, topics)
    writer.start()
    rng = random.Random(29)
    try:
        for round_ in range(ROUNDS):
            logs = [open(tmp_path / f"{kind}-{round_}.log", "wb") for kind in ("ingest", "maintain")]  # noqa: SIM115
            ingest = subprocess.Popen(ingest_argv(config, "--follow", pipeline="events"), env=process_env(),
                                      stdout=logs[0], stderr=logs[0], start_new_session=True)
            before = delta_versions(target)
            wait_for_new_version(target, before, ingest, tmp_path / f"ingest-{round_}.log", timeout=240)
            maintain = subprocess.Popen(_maintain_argv(config), env=process_env(), stdout=logs[1], stderr=logs[1],
                                        start_new_session=True)
            if round_ % 2 == 0:
                # Once the target's compaction has committed, a random instant of the rest
                # (the vacuum, the quarantine's and the ledger's compaction, the record).
                _wait_for_compaction(target, before, maintain, tmp_path / f"maintain-{round_}.log")
                time.sleep(rng.uniform(0, 4))
            else:
                time.sleep(rng.uniform(2, 25))  # a random instant: start-up, compaction or vacuum
            for proc in (ingest, maintain):
                kill_group(proc)  # type: ignore[arg-type]  (the JVMs too)
            for log in logs:
                log.close()
    finally:
        writer.stop()
    history = [(int(r.version), r.operation) for r in
               DeltaTable.forPath(spark, str(target)).history().select("version", "operation").collect()]
    compactions = sorted(v for v, op in history if op == "OPTIMIZE")
    assert any(v < max(w for w, op in history if op == "WRITE") for v in compactions), \
        f"no compaction landed between ingest commits: {sorted(history)}"

    done = subprocess.run(ingest_argv(config, pipeline="events"), env=process_env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    final = subprocess.run(_maintain_argv(config), env=process_env(), capture_output=True, text=True,
                           timeout=600, check=False)
    assert final.returncode == 0, final.stderr[-3000:]
    # One table of the three tables on stdout; VACUUM's own print went to the log file.
    lines = final.stdout.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    assert [line.split()[0] for line in lines[rule + 1:rule + 4]] == ["target", "quarantine", "ledger"], lines
    assert "Deleted" not in final.stdout + final.stderr and "retention 168 h" in final.stdout, final.stdout

    versions = sorted(int(r.version) for r in DeltaTable.forPath(spark, str(target)).history().select(
        "version").collect())
    for version in versions:
        torn = {txn: n for txn, n in _txns(spark, str(target), version).items() if n[0] != n[1]}
        assert not torn, f"version {version}: torn source transactions {list(torn.items())[:3]}"
    assert table_keys(spark, str(target)) == kafka_keys(kafka_bootstrap, topics)
    per_batch = target_commits_per_batch(spark, str(target), "events")
    assert per_batch and max(per_batch.values()) == 1, Counter(per_batch).most_common(3)
    assert len(_txns(spark, str(target))) == writer.written
