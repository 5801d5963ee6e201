"""SIGTERM to a whole process group, as systemd (``KillMode=control-group``), ``timeout`` or a
terminal sends it: `tidemark relay run` and `tidemark serve --relay` (its Spark JVM, its flow runs,
its supervised relay) each exit cleanly (0, or 143 for a process that dies of the signal), with no
internal error and no process left behind, and nothing is lost or doubled: the relay's topics hold
every committed event once (G4) and the served table equals them, each source transaction whole.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests import g3_checks as g3
from tests.ingest_harness import ingest_argv, process_env
from tests.integration.test_faults_follower import follower_config, tail
from tests.orchestration_harness import prefect_env, wait_for_line
from tests.relay_harness import RelaySetup, Writers, assert_relayed_exactly_once, kill_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CLEAN = (0, 143, -signal.SIGTERM)


def group_members(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def assert_group_gone(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left running after the group's SIGTERM: {[(p.pid, p.cmdline()[:6]) for p in left]}"


def test_sigterm_to_the_relays_process_group_loses_and_doubles_nothing(tmp_path: Path, postgres_dsn: str,
                                                                       kafka_bootstrap: str) -> None:
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=5)
    writers = Writers(setup, threads=3, late_rate=0.2, rollback_rate=0.15, pause=0.01, seed=81).start()
    rng = random.Random(81)
    codes = []
    try:
        for _ in range(2):
            relay = setup.start()
            time.sleep(rng.uniform(3, 8))  # resuming, mid-group, mid-acknowledgement
            assert relay.poll() is None, f"relay exited {relay.returncode}:\n{setup.log_tail()}"
            os.killpg(relay.pid, signal.SIGTERM)
            try:
                codes.append(relay.wait(60))
            except subprocess.TimeoutExpired:
                kill_group(relay)
                raise AssertionError(f"the relay did not stop within 60 s of SIGTERM:\n{setup.log_tail()}") from None
            assert codes[-1] in CLEAN, f"relay exited {codes[-1]} on SIGTERM to its group:\n{setup.log_tail()}"
            assert_group_gone(relay.pid)
    finally:
        writers.stop()
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    log = (tmp_path / "relay.log").read_text(errors="replace")
    assert "internal error" not in log and "Traceback" not in log, setup.log_tail(60)
    assert setup.outbox_rows() == 0
    print(f"\nexit codes {codes}; {counts}")


def test_sigterm_to_serves_process_group_exits_cleanly_and_loses_nothing(  # type: ignore[no-untyped-def]
        spark, prefect_api: str, postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    """`serve --relay` with a G3 pipeline on a 5-second schedule over the relay's topics; SIGTERM to
    its group while writers commit and a run is likely in flight."""
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=5)
    _, pipeline = follower_config(setup, tmp_path / "pipeline.yaml", str(tmp_path / "table"))
    config = yaml.safe_load(setup.config.read_text())
    config["pipelines"] = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())["pipelines"]
    config["pipelines"][0]["schedule"] = {"ingest_every_seconds": 5, "audit_every_seconds": None,
                                          "maintain_every_seconds": 3600}
    serve_config = tmp_path / "serve.yaml"
    serve_config.write_text(yaml.safe_dump(config))
    writers = Writers(setup, threads=1, late_rate=0.2, rollback_rate=0.15, pause=0.3, seed=82).start()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "serve", "--relay", "--config", str(serve_config)],
                                 env=prefect_env(prefect_api, tmp_path / "prefect-home"), stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ran = "- faults: "  # a scheduled run's report line ("faults: N batch(es), ...")
        wait_for_line(log, ran, serve, timeout=400)
        deadline = time.monotonic() + 120
        while log.read_text(errors="replace").count(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(random.Random(82).uniform(1, 4))  # the next run is most likely in flight
        members = [p.cmdline()[:6] for p in group_members(serve.pid)]
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            code = serve.wait(180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve did not stop within 180 s of SIGTERM:\n{tail(log, 60)}") from None
    finally:
        writers.stop()
        if serve.poll() is None:
            kill_group(serve)  # type: ignore[arg-type]
    text = log.read_text(errors="replace")
    assert code in CLEAN, f"serve exited {code} on SIGTERM to its group:\n{tail(log, 60)}"
    assert "internal error" not in text, tail(log, 80)
    assert_group_gone(serve.pid)
    # Nothing lost: what the supervised relay left, a relay of the same id relays; then every event is once.
    setup.drain()
    assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    # And the table: a bounded run finishes (recovers) the batch the SIGTERM met; then it equals the topics.
    done = subprocess.run(ingest_argv(serve_config, pipeline="faults"), env=process_env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    txns, offsets = g3.written(setup)
    batches = g3.assert_whole_and_progressing(spark, pipeline, txns, offsets)
    print(f"\nserve exit {code}; group at SIGTERM {members}; {batches} batches; after: {done.stderr.strip()[-300:]}")
