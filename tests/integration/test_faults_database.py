"""PostgreSQL crashing (immediate shutdown: no checkpoint, crash recovery on start) under a running
`tidemark relay run` while writers commit: every committed transaction reaches Kafka once (G4); a
transaction whose COMMIT got no answer reaches it once or not at all, whole, never twice.

An immediate shutdown loses the replication slot's position back to the last checkpoint, so the
restarted server streams again transactions the relay already produced: its own position in
Kafka must keep them out.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from infra.postgres import _bin
from outbox import wire
from outbox.schema import add_event
from tests.relay_harness import (
    AGGREGATES,
    KEYS,
    RelaySetup,
    SourceTxn,
    Writers,
    assert_relayed_exactly_once,
    header,
    kill_group,
)
from tests.stack_fixtures import postgres_server
from tidemark.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class _Lost(Exception):
    """The connection died under a transaction."""


@dataclass(eq=False)
class CrashWriters(Writers):
    """:class:`Writers` that survive the server's crash: a transaction cut before its COMMIT was sent
    is rolled back (recorded so); one whose COMMIT got no answer is *uncertain* (recorded apart);
    then the writer reconnects once the server is back."""

    uncertain: list[SourceTxn] = field(default_factory=list)
    cut: int = 0

    def transaction(self, conn: Any, rng: random.Random) -> None:
        keys = sorted(rng.choice(KEYS) for _ in range(rng.randint(1, 20)))
        late, rollback = rng.random() < self.late_rate, rng.random() < self.rollback_rate
        events: list[tuple[str, str, int, str]] = []
        xid = -1
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                xid = int(cur.fetchone()[0])
                if late:
                    time.sleep(rng.uniform(0.05, 0.3))
                for key in keys:
                    cur.execute(f"UPDATE {self.setup.keys_table} SET seq = seq + 1 WHERE key = %s RETURNING seq",
                                (key,))
                    seq = int(cur.fetchone()[0])
                    aggregate = rng.choice(AGGREGATES)
                    eid = add_event(cur, aggregate, key, "Changed", {"key": key, "seq": seq}, table=self.setup.table)
                    events.append((str(eid), key, seq, aggregate))
            if rollback:
                conn.rollback()
        except psycopg2.Error as exc:  # before COMMIT: nothing of it is committed
            with self._lock:
                self.rolled_back.update(e[0] for e in events)
                self.cut += 1
            raise _Lost from exc
        if rollback:
            with self._lock:
                self.rolled_back.update(e[0] for e in events)
            return
        try:
            conn.commit()
        except psycopg2.Error as exc:  # COMMIT sent, no answer: committed or not, nobody knows
            with self._lock:
                self.uncertain.append(SourceTxn(xid, events))
            raise _Lost from exc
        with self._lock:
            self.committed.append(SourceTxn(xid, events))

    def _loop(self, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        try:
            while not self._stop.is_set():
                try:
                    conn = self.setup.connect()
                except psycopg2.Error:
                    time.sleep(0.3)  # the server is down: ask again
                    continue
                try:
                    while not self._stop.is_set():
                        self.transaction(conn, rng)
                        if self.pause:
                            time.sleep(self.pause)
                except _Lost:
                    time.sleep(0.3)
                finally:
                    try:
                        conn.close()
                    except psycopg2.Error:
                        pass
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)


def test_postgres_crashing_under_the_relay_loses_and_doubles_nothing(settings: Settings, tmp_path: Path,
                                                                    kafka_bootstrap: str) -> None:
    if settings.postgres.dsn:
        pytest.skip("crashes a PostgreSQL of its own")
    # Not under pytest's temp root: the server runs as another user, and a pytest session starting
    # meanwhile makes that root private again (tests/conftest.py's postgres_dsn).
    state = Path(tempfile.mkdtemp(prefix="tidemark-test-faults-pg-"))
    try:
        _crash_under_the_relay(settings, state, tmp_path, kafka_bootstrap)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _crash_under_the_relay(settings: Settings, state: Path, tmp_path: Path, kafka_bootstrap: str) -> None:
    with postgres_server(settings, state) as (dsn, pg):
        if pg is None:
            pytest.skip("needs the embedded PostgreSQL to crash it")
        setup = RelaySetup.create(tmp_path, dsn, kafka_bootstrap, ack_every=5)
        with setup.connect() as conn, conn.cursor() as cur:
            # Work at COMMIT (a deferred trigger), so a crash often finds a COMMIT sent and unanswered.
            cur.execute("CREATE FUNCTION faults_slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN PERFORM pg_sleep(0.01); RETURN NULL; END $$")
            cur.execute(f"CREATE CONSTRAINT TRIGGER faults_slow_commit AFTER INSERT ON {setup.table} "
                        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION faults_slow_commit()")
        writers = CrashWriters(setup, threads=3, late_rate=0.2, rollback_rate=0.15, pause=0.01, seed=71).start()
        relay = setup.start()
        rng = random.Random(71)
        crashes = 2
        try:
            time.sleep(6)
            for n in range(crashes):
                done = pg._pg(_bin("pg_ctl"), "-D", str(pg.data), "-m", "immediate", "-w", "-t", "60", "stop")
                assert done.returncode == 0, done.stdout + done.stderr
                time.sleep(rng.uniform(3, 8))
                pg.start()
                assert relay.poll() is None, f"crash {n}: the relay exited {relay.returncode}:\n{setup.log_tail()}"
                time.sleep(rng.uniform(5, 9))
            writers.stop()
            setup.catch_up_and_stop(relay)
        finally:
            writers.halt()
            if relay.poll() is None:
                kill_group(relay)
        ids = Counter(header(r, wire.EVENT_ID) for r in setup.records())
        # An uncertain transaction: all of it once, or nothing of it.
        arrived, lost = [], []
        for txn in writers.uncertain:
            seen = [ids[e[0]] for e in txn.events]
            assert seen in ([1] * len(seen), [0] * len(seen)), (
                f"uncertain transaction {txn.xid}: its events arrived {seen} times (all once or none)")
            (arrived if seen and seen[0] else lost).append(txn)
        counts = assert_relayed_exactly_once(setup, writers.committed + arrived,
                                             writers.rolled_back | {e[0] for t in lost for e in t.events})
        log = (tmp_path / "relay.log").read_text(errors="replace")
        assert "PostgreSQL connection lost" in log, "the relay never felt the crashes"
        assert "internal error" not in log and "Traceback" not in log, setup.log_tail(60)
        assert counts["transactions"] > 100, counts
        assert writers.uncertain, "no crash found a COMMIT unanswered: the test proves less than it claims"
        print(f"\n{crashes} crashes; {counts}; {len(writers.uncertain)} uncertain ({len(arrived)} arrived), "
              f"{writers.cut} cut before COMMIT")
