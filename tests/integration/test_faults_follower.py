"""Kafka faults under both sides at once: `tidemark relay run` fed by concurrent writers and an
unsupervised `tidemark ingest --follow` (G3, a record cap) as real processes, while brokers are
SIGKILLed and restarted under them. Neither process may exit; once the writers stop and the
relay catches up, the table equals the topics' read_committed view, each source transaction
whole in one version (G1, G3), and a SIGTERM to the follower's whole process group ends it
with exit 0 after the batch in flight.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import g3_checks as g3
from tests.ingest_harness import ingest_argv, process_env
from tests.relay_harness import RelaySetup, Writers, assert_relayed_exactly_once, kill_group
from tests.stack_fixtures import kafka_cluster
from tidemark.config import PipelineConfig, parse_config
from tidemark.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: The relay's settings for a cluster that loses brokers: a short retry window and transaction
#: timeout, so an outage longer than both makes the relay step back and resume by itself.
RELAY_ONE = {"ack_every": 5, "kafka_retry_seconds": 5, "transaction_timeout_ms": 10_000}
RELAY_THREE = {**RELAY_ONE, "topic_partitions": None, "replication_factor": 3, "min_insync_replicas": 2}


def follower_config(setup: RelaySetup, path: Path, target: str, *, cap: int = 200) -> tuple[Path, PipelineConfig]:
    """A G3 pipeline over the relay's three topics (as tests/integration/test_transactions_catchup.py),
    written to ``path`` for `tidemark ingest --follow`; and the same config parsed, for the checks."""
    pattern = setup.prefix.replace(".", r"\.") + r"\.(order|payment|shipment)"
    body: dict[str, Any] = {
        "kafka": {"bootstrap_servers": setup.bootstrap},
        "pipelines": [{"name": "faults", "topic_pattern": pattern, "target": target,
                       "schema": "key STRING, seq BIGINT", "event_id": "header:id", "dedup": {},
                       "max_records_per_batch": cap, "trigger_interval_seconds": 1,
                       "transactions": {"manifest_topic": setup.manifest_topic,
                                        "incomplete_timeout_seconds": 120}}]}
    path.write_text(yaml.safe_dump(body))
    return path, parse_config(body).pipelines[0]


def start_follower(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`ingest --follow` in a process group of its own (its Spark JVM in it), output to ``log``."""
    argv = ingest_argv(config, "--follow", pipeline="faults")
    argv.insert(3, "--log-json")  # INFO lines (each batch, each wait) in the log too, not only warnings
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=process_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def wait_for_topics(setup: RelaySetup, relay: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until the relay has made all three event topics (the follower's pattern then matches them all)."""
    deadline = time.monotonic() + timeout
    while len(setup.event_topics()) < 3:
        assert relay.poll() is None, f"relay exited {relay.returncode}:\n{setup.log_tail()}"
        assert time.monotonic() < deadline, f"the relay made {setup.event_topics()} within {timeout:.0f} s"
        time.sleep(1)


def wait_for_table(spark: Any, target: str, rows: int, follower: subprocess.Popen[bytes], log: Path,
                   timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while (have := g3.table_rows(spark, target)) < rows:
        assert follower.poll() is None, f"the follower exited {follower.returncode}:\n{tail(log)}"
        assert time.monotonic() < deadline, f"the table holds {have} of {rows} rows after {timeout:.0f} s:\n{tail(log)}"
        time.sleep(3)


def stop_follower_group(follower: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM to the follower's whole process group (as systemd or a terminal sends it): the batch in
    flight finishes and the process exits 0, with no internal error."""
    os.killpg(follower.pid, signal.SIGTERM)
    try:
        code = follower.wait(180)
    except subprocess.TimeoutExpired:
        kill_group(follower)  # type: ignore[arg-type]
        raise AssertionError(f"the follower did not stop within 180 s of SIGTERM:\n{tail(log)}") from None
    text = log.read_text(errors="replace")
    assert code == 0, f"the follower exited {code} on SIGTERM to its process group:\n{tail(log)}"
    assert "internal error" not in text, f"the follower logged an internal error:\n{tail(log, 80)}"


def assert_end_state(spark: Any, setup: RelaySetup, writers: Writers, pipeline: PipelineConfig,
                     follower: subprocess.Popen[bytes], log: Path) -> int:
    """The topics hold every committed event once (G4); the follower brings the table to equal them,
    every version whole (G1, G3); then SIGTERM to its process group ends it with 0."""
    assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    txns, offsets = g3.written(setup)
    wait_for_table(spark, pipeline.target, len(offsets), follower, log)
    stop_follower_group(follower, log)
    return g3.assert_whole_and_progressing(spark, pipeline, txns, offsets)


def wait_for_rows(spark: Any, target: str, follower: subprocess.Popen[bytes], log: Path,
                  timeout: float = 180) -> None:
    """Until the follower has committed its first batch."""
    deadline = time.monotonic() + timeout
    while g3.table_rows(spark, target) == 0:
        assert follower.poll() is None, f"the follower exited {follower.returncode}:\n{tail(log)}"
        assert time.monotonic() < deadline, f"no batch within {timeout:.0f} s:\n{tail(log)}"
        time.sleep(2)


def outage_lines(log: Path) -> dict[str, int]:
    text = log.read_text(errors="replace")
    return {"outage waits": text.count("outage wait "), "answers again": text.count("answers again"),
            "start waits": text.count("--follow waits"), "batches": text.count("committed: ")}


@pytest.mark.parametrize("brokers", [1])
def test_brokers_killed_and_restarted_under_relay_and_follower(spark, settings: Settings, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               postgres_dsn: str, brokers: int) -> None:
    """The broker SIGKILLed and restarted three times; the first time the follower starts while it
    is down (it must wait, not exit). Three brokers: the leader test below."""
    if settings.kafka.bootstrap_servers:
        pytest.skip("kills brokers of its own")
    rng = random.Random(brokers)
    with kafka_cluster(settings, tmp_path / "kafka", brokers=brokers) as (bootstrap, cluster):
        if cluster is None:
            pytest.skip("needs the embedded cluster to kill its brokers")
        setup = RelaySetup.create(tmp_path, postgres_dsn, bootstrap, **(RELAY_THREE if brokers == 3 else RELAY_ONE))
        config, pipeline = follower_config(setup, tmp_path / "follow.yaml", str(tmp_path / "table"))
        log = tmp_path / "follow.log"
        # Slow writers: a G3 batch takes seconds on a loaded 2-core host, and the follower must keep up.
        writers = Writers(setup, threads=1, late_rate=0.2, rollback_rate=0.15, pause=0.5, seed=50 + brokers).start()
        relay = setup.start()
        follower: subprocess.Popen[bytes] | None = None
        kills = 3 if brokers == 1 else 2  # CI budget: each kill a broker restart and the follower's catch-up
        try:
            wait_for_topics(setup, relay)
            for round_ in range(kills):
                node = rng.randint(1, brokers)
                cluster.kill_node(node)
                if follower is None:  # it starts against a cluster that does not answer (one broker) or lost one
                    follower = start_follower(config, log)
                time.sleep(rng.uniform(5, 12))
                cluster.start_node(node)
                assert relay.poll() is None, f"round {round_}: relay exited {relay.returncode}:\n{setup.log_tail()}"
                assert follower.poll() is None, f"round {round_}: follower exited {follower.returncode}:\n{tail(log)}"
                if round_ == 0:  # the later kills land on a follower mid-run
                    wait_for_rows(spark, pipeline.target, follower, log)
                time.sleep(rng.uniform(4, 8))
            writers.stop()
            setup.catch_up_and_stop(relay)
            assert follower is not None
            batches = assert_end_state(spark, setup, writers, pipeline, follower, log)
        finally:
            writers.halt()
            if relay.poll() is None:
                kill_group(relay)
            if follower is not None and follower.poll() is None:
                kill_group(follower)  # type: ignore[arg-type]
        print(f"\n{brokers} broker(s), {kills} kills: {batches} batches, {sum(len(t.events) for t in writers.committed)} "
              f"events; follower {outage_lines(log)}")


def _leader(admin: Any, topic: str, partition: int) -> int:
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)


def test_a_leader_killed_mid_transaction_under_relay_and_follower(spark, settings: Settings, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  postgres_dsn: str) -> None:
    """Three brokers (RF 3, min ISR 2): the leader of an event partition, then of the manifest's
    partition, then of the relay-offsets partition, each SIGKILLed while the relay commits every ~100 ms (so mid-transaction)
    and the follower reads; each restarted after a while."""
    from confluent_kafka.admin import AdminClient

    if settings.kafka.bootstrap_servers:
        pytest.skip("kills brokers of its own")
    with kafka_cluster(settings, tmp_path / "kafka", brokers=3) as (bootstrap, cluster):
        if cluster is None:
            pytest.skip("needs the embedded cluster to kill its brokers")
        setup = RelaySetup.create(tmp_path, postgres_dsn, bootstrap, **RELAY_THREE)
        config, pipeline = follower_config(setup, tmp_path / "follow.yaml", str(tmp_path / "table"))
        log = tmp_path / "follow.log"
        writers = Writers(setup, threads=1, late_rate=0.2, rollback_rate=0.15, pause=0.5, seed=61).start()
        relay = setup.start()
        follower: subprocess.Popen[bytes] | None = None
        admin = AdminClient({"bootstrap.servers": bootstrap})
        killed: list[tuple[str, int]] = []
        try:
            wait_for_topics(setup, relay)
            follower = start_follower(config, log)
            wait_for_rows(spark, pipeline.target, follower, log)  # the follower is reading when the leaders die
            events = setup.event_topics()
            for topic in (events[0], setup.manifest_topic, setup.offsets_topic):
                leader = _leader(admin, topic, 0)
                assert leader > 0, f"{topic}:0 has no leader"
                cluster.kill_node(leader)
                killed.append((topic, leader))
                time.sleep(8)
                assert relay.poll() is None, f"{topic}: relay exited {relay.returncode}:\n{setup.log_tail()}"
                assert follower.poll() is None, f"{topic}: follower exited {follower.returncode}:\n{tail(log)}"
                cluster.start_node(leader)
                time.sleep(5)
            writers.stop()
            setup.catch_up_and_stop(relay)
            batches = assert_end_state(spark, setup, writers, pipeline, follower, log)
        finally:
            del admin  # its librdkafka handle would retry the stopped brokers, and log each try
            writers.halt()
            if relay.poll() is None:
                kill_group(relay)
            if follower is not None and follower.poll() is None:
                kill_group(follower)  # type: ignore[arg-type]
        print(f"\nkilled {killed}: {batches} batches, {sum(len(t.events) for t in writers.committed)} events; "
              f"follower {outage_lines(log)}")
