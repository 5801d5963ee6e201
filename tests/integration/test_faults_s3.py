"""The object store hanging under a running `tidemark ingest --follow` (G3, tables on s3a://) fed by
the relay: the embedded S3 server is SIGSTOPped for 20 s. A request in flight
then neither answers nor fails until a client timeout; the follower must wait the store out and
never exit, and the table must end equal to the topics, each source transaction whole in one
version (G1, G3), and a SIGTERM to its process group end it with exit 0.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest

from tests import g3_checks as g3
from tests.conftest import s3_server
from tests.integration.test_faults_follower import (
    assert_end_state,
    follower_config,
    outage_lines,
    start_follower,
    tail,
    wait_for_rows,
    wait_for_topics,
)
from tests.relay_harness import RelaySetup, Writers, kill_group

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(900)]


@pytest.mark.usefixtures("needs_s3")
def test_an_object_store_that_hangs_is_waited_out_by_the_follower(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, table_root: str) -> None:
    server = s3_server()
    assert server is not None
    store = server.pidfile.process()
    assert store is not None, "the S3 stage's server is not running"
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap)
    config, pipeline = follower_config(setup, tmp_path / "follow.yaml", f"{table_root}/table")
    log = tmp_path / "follow.log"
    writers = Writers(setup, threads=1, late_rate=0.2, rollback_rate=0.15, pause=0.5, seed=91).start()
    relay = setup.start()
    follower: subprocess.Popen[bytes] | None = None
    rng = random.Random(91)
    hangs = (20.0,)
    try:
        wait_for_topics(setup, relay)
        follower = start_follower(config, log)
        wait_for_rows(spark, pipeline.target, follower, log)
        for seconds in hangs:
            time.sleep(rng.uniform(2, 6))  # somewhere in a batch: a read, the claim, the commit
            store.suspend()
            try:
                time.sleep(seconds)
            finally:
                store.resume()
            assert follower.poll() is None, f"the follower exited {follower.returncode}:\n{tail(log)}"
            assert relay.poll() is None, f"relay exited {relay.returncode}:\n{setup.log_tail()}"
        writers.stop()
        setup.catch_up_and_stop(relay)
        batches = assert_end_state(spark, setup, writers, pipeline, follower, log)
    finally:
        store.resume()
        writers.halt()
        if relay.poll() is None:
            kill_group(relay)
        if follower is not None and follower.poll() is None:
            kill_group(follower)  # type: ignore[arg-type]
    print(f"\nS3 hung {hangs} s: {batches} batches; follower {outage_lines(log)}; "
          f"{g3.table_rows(spark, pipeline.target)} rows")
