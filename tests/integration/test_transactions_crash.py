"""G3 end to end under SIGKILL: application transactions -> outbox -> relay -> 3 topics x 3
partitions -> ingest, killed at random instants and at named steps, with random caps so
batches end in the middle of transactions. Afterwards every Delta version of the table
(time travel over all of them) holds each source transaction whole or not at all, and
the final table is exactly the read_committed content of the topics.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from offsets.ledger import Ledger
from offsets.protocol import CRASH_POINTS
from tests.ingest_harness import delta_versions, ingest_argv, process_env, wait_for_new_version
from tests.relay_harness import RelaySetup, Writers, kill_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _config(setup: RelaySetup, target: Path, cap: int) -> Path:
    path = setup.tmp / "ingest.yaml"
    pattern = setup.prefix.replace(".", r"\.") + r"\.(order|payment|shipment)"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": setup.bootstrap},
        "pipelines": [{"name": "events", "topic_pattern": pattern, "target": str(target),
                       "schema": "key STRING, seq BIGINT", "max_records_per_batch": cap,
                       "trigger_interval_seconds": 1}],
    }))
    return path


def test_source_transactions_are_whole_in_every_version_across_kills(
        spark, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap)
    target = tmp_path / "events"
    # A few thousand events: enough for every kill to land mid-stream, few enough to catch up.
    writers = Writers(setup, threads=2, pause=0.4, late_rate=0.2, rollback_rate=0.15).start()
    relay = setup.start("--partitions", "3")
    rng = random.Random(17)
    kills = round_ = 0
    try:
        # At least 6 kills, and on until the table has 10 versions to time-travel over: on a
        # loaded machine a batch takes ~8 s, so the round count adapts instead of the bar.
        while (kills < 6 or delta_versions(target) < 10) and round_ < 16:
            config = _config(setup, target, rng.choice([20, 60, 250, 1000]))
            crash_at = rng.choice(CRASH_POINTS) if round_ % 2 else None
            log_path = tmp_path / f"ingest-{round_}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - the child owns it
            before = delta_versions(target)
            proc = subprocess.Popen(ingest_argv(config, "--follow", pipeline="events"), env=process_env(crash_at),
                                    stdout=log, stderr=log, start_new_session=True)
            if crash_at is None:
                # A random instant after this run's first to third commit: the next batch's
                # plan, claim, write or settle, or the idle wait between batches. (A named-step
                # kill usually lands before its run's first commit, so these rounds make the
                # versions.)
                wait_for_new_version(target, before + rng.randint(0, 2), proc, log_path)
                time.sleep(rng.uniform(0, 8))
            else:
                try:
                    code = proc.wait(240)
                except subprocess.TimeoutExpired:  # the step never came round: count it as a random kill
                    code = -signal.SIGKILL
                assert code == -signal.SIGKILL, (crash_at, code, log_path.read_text())
            kill_group(proc)  # type: ignore[arg-type]  (the driver's JVM too)
            kills += 1
            round_ += 1
    finally:
        writers.stop()
        relay.send_signal(signal.SIGTERM)
        relay.wait(120)
    setup.drain()
    done = subprocess.run(ingest_argv(_config(setup, target, 100_000), pipeline="events"), env=process_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert kills >= 6, f"only {kills} ingest runs were killed"

    intents = Ledger(spark, str(target) + "_tidemark_ledger", "events").history()
    assert sum(i.held for i in intents) > 0, "no batch cut a transaction: the test proves less than it claims"

    # Every version: each source transaction either absent or whole.
    versions = [int(r.version) for r in DeltaTable.forPath(spark, str(target)).history().select("version").collect()]
    assert len(versions) >= 10, f"only {len(versions)} table versions: too few to prove much"
    for version in sorted(versions):
        table = spark.read.format("delta").option("versionAsOf", version).load(str(target))
        torn = (table.groupBy("_tidemark_txn.id").agg(F.count(F.lit(1)).alias("n"),
                                                       F.max("_tidemark_txn.expected").alias("expected"))
                .where("n != expected").collect())
        assert not torn, f"version {version}: torn source transactions {torn[:3]}"

    # The final table: exactly the topics' read_committed records, each committed event once.
    final = spark.read.format("delta").load(str(target))
    in_table = Counter((r[0], r[1], r[2]) for r in final.select(
        "_kafka_topic", "_kafka_partition", "_kafka_offset").collect())
    in_kafka = Counter((r.topic, r.partition, r.offset) for r in setup.records())
    assert in_table == in_kafka, f"table vs topics: {len(in_table)} vs {len(in_kafka)} records"
    ids = Counter(r[0] for r in final.select("_tidemark_event_id").collect())
    committed = {e[0] for t in writers.committed for e in t.events}
    assert set(ids) == committed and max(ids.values()) == 1
    print(f"{len(writers.committed)} source transactions, {len(committed)} events, {len(versions)} versions, "
          f"{kills} kills, {sum(i.held for i in intents)} transactions held by cuts; pid {os.getpid()}")
