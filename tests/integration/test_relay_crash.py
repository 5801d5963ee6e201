"""Slow fault injection for the relay: SIGKILL at random instants under concurrent writers,
and PostgreSQL then the broker restarted under a running relay (issue 4, G4 and G5)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tests.relay_harness import RelaySetup, Writers, assert_relayed_exactly_once, kill_group
from tests.stack_fixtures import kafka_cluster, postgres_server
from tidemark.settings import Settings

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)
def test_exactly_once_after_sigkill_at_random_instants(tmp_path: Path, postgres_dsn: str,
                                                       kafka_bootstrap: str) -> None:
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=5)
    writers = Writers(setup, threads=4, late_rate=0.2, rollback_rate=0.15, pause=0.01, seed=11).start()
    rng = random.Random(11)
    kills = 0
    try:
        for _ in range(22):
            proc = setup.start()
            time.sleep(rng.uniform(0.3, 6.0))  # start-up, resume, mid-transaction, mid-acknowledgement
            if proc.poll() is None:
                kills += 1
            kill_group(proc)
    finally:
        writers.stop()
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    log = (tmp_path / "relay.log").read_text(errors="replace")
    print(f"{kills} kills; {counts}")
    assert kills >= 20
    assert counts["id_order_inversions"] > 0, "no transaction committed out of id order: the test proves less"
    assert counts["rolled_back_events"] > 0 and counts["transactions"] > 200
    assert "Traceback" not in log
    assert setup.outbox_rows() == 0


@pytest.mark.timeout(1200)
def test_relay_recovers_by_itself_from_postgres_then_broker_restarts(settings: Settings, tmp_path: Path) -> None:
    if settings.kafka.bootstrap_servers or settings.postgres.dsn:
        pytest.skip("restarts servers of its own")
    with postgres_server(settings, tmp_path / "pg") as (dsn, pg), \
            kafka_cluster(settings, tmp_path / "kafka") as (bootstrap, kafka):
        if pg is None or kafka is None:
            pytest.skip("needs the embedded servers to restart them")
        setup = RelaySetup.create(tmp_path, dsn, bootstrap, ack_every=5)
        backlog = Writers(setup, threads=4, late_rate=0.2, rollback_rate=0.15, seed=21).start()
        time.sleep(8)  # a backlog for the relay to work through across the restarts
        backlog.stop()
        relay = setup.start()
        try:
            time.sleep(2)
            pg.stop()  # fast shutdown: the relay's sessions are cut
            time.sleep(3)
            pg.start()
            after_pg = Writers(setup, threads=2, late_rate=0.2, rollback_rate=0.15, pause=0.02, seed=22).start()
            time.sleep(4)
            kafka.kill_node(1)  # SIGKILL, mid-transaction most likely
            time.sleep(5)
            kafka.start_node(1)
            time.sleep(4)
            after_pg.stop()
            deadline = time.monotonic() + 240
            while setup.outbox_rows() and time.monotonic() < deadline:
                assert relay.poll() is None, f"relay exited {relay.returncode}:\n{setup.log_tail()}"
                time.sleep(1)
            assert setup.outbox_rows() == 0, f"relay did not catch up:\n{setup.log_tail()}"
            assert relay.poll() is None, "the relay must have recovered by itself, without a restart"
            relay.terminate()
            assert relay.wait(60) == 0, setup.log_tail()
        finally:
            if relay.poll() is None:
                kill_group(relay)
        assert_relayed_exactly_once(setup, backlog.committed + after_pg.committed,
                                    backlog.rolled_back | after_pg.rolled_back)
        log = (tmp_path / "relay.log").read_text(errors="replace")
        assert "PostgreSQL connection lost" in log  # the restart was felt, and survived
        report = json.loads(next(line for line in reversed(log.splitlines()) if line.startswith("{")))
        # The broker's death cut the producer's connections: before its next transaction a new
        # instance fenced in the old one, so no late request of a past transaction can join it.
        assert report["refenced"] >= 1, report
