"""Shared pieces of the relay tests: an outbox of its own per test, `tidemark relay run` as
a real process, writers committing (and rolling back) transactions concurrently, and
the checks that matter — the read_committed view of the topics holds every committed
event exactly once, in commit order per key, each source transaction whole and inside
exactly one Kafka transaction.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import yaml

from connectors.topic_reader import Record, read_to_end
from outbox import wire
from outbox.pgoutput import parse_lsn
from outbox.schema import TableName, add_event, init_outbox
from outbox.wire import Manifest

AGGREGATES = ("order", "payment", "shipment")
KEYS = tuple(f"agg-{i}" for i in range(8))

# (dsn, slot) of every outbox a test created: its slot is dropped when the test ends
# (``release_slots``), or the server's max_replication_slots runs out within a session.
_SLOTS: list[tuple[str, str]] = []


# Writers a test started and has not stopped: a test that fails midway leaves them writing, and
# their open transactions hold back the cluster's xmin horizon, which later tests read.
_RUNNING: set[Writers] = set()


def release_slots() -> None:
    """Halt the writers the ending test left running, and drop the replication slots it created,
    ending any walsender still on one (a relay a failed test left running). A slot another test
    still needs is never listed."""
    for writers in list(_RUNNING):
        writers.halt()
    while _SLOTS:
        dsn, slot = _SLOTS.pop()
        try:
            conn = psycopg2.connect(dsn)
        except psycopg2.Error:
            continue  # the server is gone (a test stopped its own); nothing holds a slot there
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for _ in range(50):
                    cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                    row = cur.fetchone()
                    if row is None:
                        break
                    if row[0] is not None:
                        cur.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                        time.sleep(0.1)
                        continue
                    try:
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                        break
                    except psycopg2.errors.ObjectInUse:
                        time.sleep(0.1)
        finally:
            conn.close()


@dataclass(frozen=True)
class RelaySetup:
    dsn: str
    bootstrap: str
    relay_id: str
    table: str
    prefix: str
    offsets_topic: str
    manifest_topic: str
    config: Path
    tmp: Path
    client: dict[str, Any] = field(default_factory=dict)
    """librdkafka properties besides the bootstrap servers (a secured cluster's credentials)."""

    @classmethod
    def create(cls, tmp: Path, dsn: str, bootstrap: str, **relay: Any) -> RelaySetup:
        run = uuid.uuid4().hex[:8]
        relay_id, table, prefix = f"r-{run}", f"public.outbox_{run}", f"relaytest.{run}"
        body = {"id": relay_id, "table": table, "topic": prefix + ".{aggregatetype}",
                "offsets_topic": f"relaytest.{run}.offsets", "manifest_topic": f"relaytest.{run}.manifest",
                "topic_partitions": 3, **relay}
        config = tmp / "tidemark.yaml"
        config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap},
                                          "postgres": {"dsn": dsn}, "relay": body}))
        setup = cls(dsn, bootstrap, relay_id, table, prefix, body["offsets_topic"], body["manifest_topic"], config, tmp)
        init_outbox(dsn, table=TableName.parse(table), publication=f"tidemark_r_{run}", slot=f"tidemark_r_{run}",
                    payload=relay.get("payload_column", "jsonb"))
        _SLOTS.append((dsn, f"tidemark_r_{run}"))
        with setup.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {setup.keys_table} (key text PRIMARY KEY, seq bigint NOT NULL)")
            cur.executemany(f"INSERT INTO {setup.keys_table} VALUES (%s, 0)", [(k,) for k in KEYS])
        return setup

    def with_relay(self, name: str, **overrides: Any) -> RelaySetup:
        """The same relay with some ``relay`` settings changed, in its own config file ``name``."""
        config = yaml.safe_load(self.config.read_text())
        config["relay"].update(overrides)
        path = self.tmp / name
        path.write_text(yaml.safe_dump(config))
        return RelaySetup(**{**self.__dict__, "config": path})

    @property
    def relay_format(self) -> str:
        """The ``relay.format`` of this relay's config."""
        return str(yaml.safe_load(self.config.read_text())["relay"].get("format", "json"))

    @property
    def slot(self) -> str:
        """The replication slot (and publication) ``create`` made for this relay."""
        return f"tidemark_r_{self.relay_id.removeprefix('r-')}"

    @property
    def keys_table(self) -> str:
        return self.table + "_keys"

    def connect(self):  # type: ignore[no-untyped-def]
        return psycopg2.connect(self.dsn)

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "tidemark.cli", "relay", "run", "--config", str(self.config), *extra]

    def env(self, crash_at: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_CRASH_AT"}
        if crash_at:
            env["TIDEMARK_CRASH_AT"] = crash_at
        return env

    def start(self, *extra: str, crash_at: str | None = None, log: str = "relay.log") -> subprocess.Popen[bytes]:
        """`tidemark relay run` in its own process group (so a kill takes all of it)."""
        out = open(self.tmp / log, "ab")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(self.argv(*extra), env=self.env(crash_at), stdout=out, stderr=out,
                                start_new_session=True)

    def run(self, *extra: str, crash_at: str | None = None, timeout: float = 180) -> int:
        proc = self.start(*extra, crash_at=crash_at)
        return proc.wait(timeout)

    def drain(self, timeout: float = 240) -> None:
        """Run the relay until it has been idle for 3 s; it must exit 0."""
        code = self.run("--idle-exit", "3", timeout=timeout)
        assert code == 0, f"draining relay exited {code}:\n{self.log_tail()}"

    def catch_up_and_stop(self, relay: subprocess.Popen[bytes], timeout: float = 240) -> None:
        """Wait until the running ``relay`` has relayed and deleted every outbox row (it must not
        exit meanwhile), then stop it with SIGTERM; it must exit 0."""
        deadline = time.monotonic() + timeout
        while self.outbox_rows() and time.monotonic() < deadline:
            assert relay.poll() is None, f"relay exited {relay.returncode}:\n{self.log_tail()}"
            time.sleep(1)
        assert self.outbox_rows() == 0, f"relay did not catch up:\n{self.log_tail()}"
        relay.terminate()
        assert relay.wait(60) == 0, self.log_tail()

    def log_tail(self, lines: int = 30) -> str:
        path = self.tmp / "relay.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def warnings(self, limit: int = 40) -> str:
        """The relay log's warnings and errors (its own and librdkafka's), for a failure message."""
        path = self.tmp / "relay.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        picked = [line for line in lines if " WARNING " in line or " ERROR " in line or line.startswith("%3|")]
        return "\n".join(picked[-limit:])

    def event_topics(self) -> list[str]:
        from confluent_kafka.admin import AdminClient

        names = AdminClient({**self.client, "bootstrap.servers": self.bootstrap}).list_topics(timeout=10).topics
        return sorted(t for t in names if t.startswith(self.prefix + ".")
                      and t not in (self.offsets_topic, self.manifest_topic))

    def records(self) -> list[Record]:
        return [r for t in self.event_topics() for r in read_to_end(self.bootstrap, t, extra=self.client)]

    def manifests(self) -> list[Manifest]:
        return [Manifest.decode(r.value or b"")
                for r in read_to_end(self.bootstrap, self.manifest_topic, extra=self.client)]

    def outbox_rows(self) -> int:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {TableName.parse(self.table).sql}")
            return int(cur.fetchone()[0])


class CommittedChecker:
    """A read_committed consumer polling the relay's event topics while a test runs.

    Each time it reaches the end of a partition (the LSO then), it notes how many events of
    each source transaction it has seen there. Everything below the LSO has been delivered
    by then, so if a source transaction were split over two Kafka transactions, a note taken
    between their commits would show part of its events in that partition.
    :meth:`assert_never_saw_part` compares every note with the final count: each must be all.
    """

    def __init__(self, bootstrap: str, setup: RelaySetup) -> None:
        self.bootstrap, self.setup = bootstrap, setup
        self.notes: list[tuple[str, str, int, int]] = []
        self.ends = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> CommittedChecker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, f"checker failed: {self.error!r}"

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"checker-{uuid.uuid4().hex[:8]}",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        counts: Counter[tuple[str, str, int]] = Counter()
        touched: dict[tuple[str, int], set[str]] = defaultdict(set)
        known: set[str] = set()
        listed = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() - listed > 1.0:
                    listed = time.monotonic()
                    with contextlib.suppress(Exception):  # the broker may be paused by the test: next round
                        for topic in [t for t in self.setup.event_topics() if t not in known]:
                            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
                            consumer.incremental_assign([TopicPartition(topic, p, 0) for p in parts])
                            known.add(topic)
                for m in consumer.consume(num_messages=1000, timeout=0.2):
                    err = m.error()
                    tp = (m.topic(), m.partition())
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self.ends += 1
                            for lsn in touched.pop(tp, ()):
                                self.notes.append((lsn, tp[0], tp[1], counts[(lsn, *tp)]))
                        continue
                    lsn = dict(m.headers() or [])[wire.LSN].decode()
                    counts[(lsn, *tp)] += 1
                    touched[tp].add(lsn)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            consumer.close()

    def assert_never_saw_part(self, setup: RelaySetup) -> None:
        final: Counter[tuple[str, str, int]] = Counter((header(r, wire.LSN), r.topic, r.partition) for r in setup.records())
        part = [(lsn, t, p, n, final[(lsn, t, p)]) for lsn, t, p, n in self.notes if n != final[(lsn, t, p)]]
        assert self.ends > 10 and self.notes, f"the checker saw too little ({self.ends} partition ends)"
        assert not part, f"a read_committed reader saw part of source transactions: {part[:5]}"


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the relay and everything in its process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@dataclass
class SourceTxn:
    xid: int
    events: list[tuple[str, str, int, str]]
    """(event id, key, seq, aggregate type)."""


@dataclass(eq=False)  # identity: held in _RUNNING
class Writers:
    """Concurrent application transactions on shared keys.

    Each event takes the next ``seq`` of its key from a counter row, locked in key
    order, so a key's seqs count its events in commit order. Some transactions take
    their transaction id first and commit late (others with later ids commit in
    between: out of id order); some roll back.
    """

    setup: RelaySetup
    threads: int = 4
    late_rate: float = 0.2
    rollback_rate: float = 0.15
    pause: float = 0.0
    seed: int = 7
    weights: tuple[float, ...] | None = None
    """Relative share of each aggregate type (topic) in :data:`AGGREGATES`; None: even."""
    committed: list[SourceTxn] = field(default_factory=list)
    rolled_back: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def transaction(self, conn: Any, rng: random.Random) -> None:
        keys = sorted(rng.choice(KEYS) for _ in range(rng.randint(1, 20)))
        late, rollback = rng.random() < self.late_rate, rng.random() < self.rollback_rate
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_xact_id()::text::bigint")
            xid = int(cur.fetchone()[0])
            if late:
                time.sleep(rng.uniform(0.05, 0.3))
            events = []
            for key in keys:
                cur.execute(f"UPDATE {self.setup.keys_table} SET seq = seq + 1 WHERE key = %s RETURNING seq", (key,))
                seq = int(cur.fetchone()[0])
                aggregate = rng.choices(AGGREGATES, self.weights)[0] if self.weights else rng.choice(AGGREGATES)
                eid = add_event(cur, aggregate, key, "Changed", {"key": key, "seq": seq}, table=self.setup.table)
                events.append((str(eid), key, seq, aggregate))
        if rollback:
            conn.rollback()
            with self._lock:
                self.rolled_back.update(e[0] for e in events)
        else:
            conn.commit()
            with self._lock:
                self.committed.append(SourceTxn(xid, events))

    def _loop(self, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        try:
            conn = self.setup.connect()
            try:
                while not self._stop.is_set():
                    self.transaction(conn, rng)
                    if self.pause:
                        time.sleep(self.pause)
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def start(self) -> Writers:
        self._workers = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(self.threads)]
        _RUNNING.add(self)
        for worker in self._workers:
            worker.start()
        return self

    def halt(self) -> None:
        """End the writing threads (each finishes its transaction first)."""
        self._stop.set()
        for worker in self._workers:
            worker.join(60)
        _RUNNING.discard(self)

    def stop(self) -> None:
        self.halt()
        assert not self.errors, f"writer failed: {self.errors[0]!r}"


def header(record: Record, name: str) -> str:
    values = [v for k, v in record.headers if k == name]
    assert len(values) == 1, f"{record.topic}:{record.partition}@{record.offset} has {len(values)} {name!r} headers"
    return values[0].decode()


def assert_relayed_exactly_once(setup: RelaySetup, committed: list[SourceTxn], rolled_back: set[str], *,
                                foreign: bool = False,
                                decode: Callable[[bytes], dict[str, Any]] | None = None) -> dict[str, int]:
    """The relay's guarantees (G4) on the topics' read_committed view; returns some counts.

    ``foreign``: another producer wrote records without the relay's headers into the same
    topics; they are left out, and a source transaction's events in a partition may have
    such records between them (the manifest's spans still say exactly where they are).
    ``decode``: how a value becomes its payload (default: JSON; ``relay.format: avro``'s values
    are Avro).
    """
    body_of = decode or (lambda value: json.loads(value or b"{}"))
    records = setup.records()
    if foreign:
        records = [r for r in records if any(k == wire.LSN for k, _ in r.headers)]
    ids = [header(r, wire.EVENT_ID) for r in records]
    duplicates = {i for i, n in Counter(ids).items() if n > 1}
    if duplicates:
        doubled = [r for r in records if header(r, wire.EVENT_ID) in duplicates]
        copies = [f"{r.topic}:{r.partition}@{r.offset} LSN {header(r, wire.LSN)} xid {header(r, wire.TXID)}" for r in doubled]
        lsns = {header(r, wire.LSN) for r in doubled}
        manifests = [m for m in setup.manifests() if any(e.txn.rsplit("/", 1)[0] in lsns for e in m.entries)]
        raise AssertionError(f"{len(duplicates)} events relayed more than once, e.g. {sorted(duplicates)[:3]}; "
                             f"their copies:\n" + "\n".join(sorted(copies)[:40]) + "\nthe manifests naming them:\n"
                             + "\n".join(repr(m) for m in manifests) + f"\nthe relay's warnings:\n{setup.warnings(80)}")
    expected = {e[0] for t in committed for e in t.events}
    missing, extra = expected - set(ids), set(ids) - expected
    assert not missing, f"{len(missing)} committed events missing, e.g. {sorted(missing)[:3]}"
    assert not (extra & rolled_back), "events of rolled-back transactions were relayed"
    assert not extra, f"{len(extra)} events nobody committed, e.g. {sorted(extra)[:3]}"

    by_id = {header(r, wire.EVENT_ID): r for r in records}
    # Per key, per topic-partition: seqs in offset order are increasing (commit order), and
    # together they are exactly 1..n (nothing lost or doubled).
    seqs: dict[str, list[int]] = defaultdict(list)
    per_partition: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        body = body_of(r.value or b"")
        seqs[body["key"]].append(body["seq"])
        per_partition[(r.topic, r.partition, body["key"])].append((r.offset, body["seq"]))
    for where, pairs in per_partition.items():
        ordered = [s for _, s in sorted(pairs)]
        assert ordered == sorted(ordered), f"key {where[2]} out of commit order in {where[0]}:{where[1]}: {ordered}"
    for key, values in seqs.items():
        assert sorted(values) == list(range(1, len(values) + 1)), f"key {key}: seqs {sorted(values)[:20]}..."

    # Each source transaction whole, with its headers right.
    by_lsn: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_lsn[header(r, wire.LSN)].append(r)
    for txn in committed:
        got = [by_id[e[0]] for e in txn.events]
        lsns = {header(r, wire.LSN) for r in got}
        assert len(lsns) == 1, f"transaction {txn.xid} split over commit LSNs {lsns}"
        group = by_lsn[lsns.pop()]
        assert len(group) == len(txn.events), f"transaction {txn.xid}: {len(group)} events under its LSN"
        assert {header(r, wire.TXID) for r in group} == {str(txn.xid)}
        assert sorted(int(header(r, wire.POSITION)) for r in group) == list(range(len(group)))
        assert {int(header(r, wire.SIZE)) for r in group} == {len(group)}
        counts = defaultdict(int)
        for r in group:
            counts[r.topic] += 1
        assert {header(r, wire.TOPIC_COUNTS) for r in group} == {json.dumps(dict(sorted(counts.items())),
                                                                           separators=(",", ":"))}

    # Each source transaction inside one Kafka transaction: in a partition a Kafka transaction
    # is a run of consecutive offsets closed by its commit marker (which takes an offset), so
    # a source transaction's events there must be one gap-free run. Group commit puts several
    # source transactions in one Kafka transaction, so a run may hold several, in commit order.
    partitions: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in records:
        partitions[(r.topic, r.partition)].append(r)
    for (topic, partition), recs in ([] if foreign else partitions.items()):
        by_txn: dict[str, list[int]] = defaultdict(list)
        for r in recs:
            by_txn[header(r, wire.LSN)].append(r.offset)
        for lsn, offsets in by_txn.items():
            offsets.sort()
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
                f"{topic}:{partition}: source transaction at LSN {lsn} is split over Kafka transactions "
                f"(offsets {offsets[:10]}...); the relay's warnings:\n{setup.warnings()}")
    # And across partitions: one manifest entry per source transaction, whose spans are exactly
    # where its events are (the manifest commits with them, so it names one Kafka transaction).
    entries: dict[str, list[tuple[str, int, int, int, int]]] = defaultdict(list)
    events_of: dict[str, int] = {}
    for manifest in setup.manifests():
        for entry in manifest.entries:
            if entry.dead_lettered:
                assert not entry.spans, f"dead-lettered {entry.txn} has spans"
                continue
            assert entry.txn not in events_of, f"source transaction {entry.txn} in two manifest records"
            events_of[entry.txn] = entry.events
            entries[entry.txn] = list(entry.spans)
    for txn in committed:
        got = [by_id[e[0]] for e in txn.events]
        name = f"{header(got[0], wire.LSN)}/{txn.xid}"
        where: dict[tuple[str, int], list[int]] = defaultdict(list)
        for r in got:
            where[(r.topic, r.partition)].append(r.offset)
        actual = sorted((t, p, min(o), max(o), len(o)) for (t, p), o in where.items())
        assert entries.get(name) == actual and events_of[name] == len(got), (
            f"manifest of {name}: {entries.get(name)} / {events_of.get(name)} events, topics hold {actual}")
    assert set(events_of) == {f"{header(by_id[t.events[0][0]], wire.LSN)}/{t.xid}" for t in committed}

    # Commit order is not id order here (the late writers), or the test proves less than it claims.
    in_commit_order = sorted(committed, key=lambda t: parse_lsn(header(by_id[t.events[0][0]], wire.LSN)))
    xids = [t.xid for t in in_commit_order]
    inversions = sum(1 for a, b in itertools.pairwise(xids) if a > b)
    return {"events": len(records), "transactions": len(committed), "id_order_inversions": inversions,
            "rolled_back_events": len(rolled_back)}


def assert_invalid_payload_stops_then_dead_letters(setup: RelaySetup, bad_payload: dict[str, Any], field: str,
                                                   decode: Callable[[bytes], dict[str, Any]]) -> None:
    """``relay.on_invalid_payload`` on a relay of ``setup``'s format: a source transaction whose
    second event's payload (``bad_payload``, on topic payment) does not match its schema stops the
    relay naming the event, subject and ``field``, with nothing of it produced; under
    ``dead_letter`` the whole transaction goes to the dead letters and the relay goes on."""
    from outbox.schema import add_event

    with setup.connect() as conn, conn.cursor() as cur:
        good = str(add_event(cur, "order", "agg-1", "Changed", {"key": "agg-1", "seq": 1}, table=setup.table))
        conn.commit()
        bad = [str(add_event(cur, "order", "agg-2", "Changed", {"key": "agg-2", "seq": 1}, table=setup.table)),
               str(add_event(cur, "payment", "agg-2", "Changed", bad_payload, table=setup.table))]
        conn.commit()
    code = setup.run("--idle-exit", "3")
    log = setup.log_tail()
    assert code == 1, log
    assert f"event {bad[1]}" in log and f"{setup.prefix}.payment-value" in log and field in log, log
    assert [header(r, wire.EVENT_ID) for r in setup.records()] == [good]  # nothing of the bad transaction
    assert setup.outbox_rows() == 2

    dead = setup.with_relay("dead.yaml", on_invalid_payload="dead_letter")
    assert dead.run("--idle-exit", "3") == 0, dead.log_tail()
    assert [header(r, wire.EVENT_ID) for r in setup.records()] == [good]
    assert setup.outbox_rows() == 0
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id::text, reason FROM {setup.table}_dead_letters ORDER BY id")
        moved = cur.fetchall()
    assert sorted(i for i, _ in moved) == sorted(bad) and all("does not match" in why for _, why in moved)
    assert [decode(r.value or b"") for r in setup.records()] == [{"key": "agg-1", "seq": 1}]


def assert_killed_relay_in_format_is_exactly_once_and_ingested(setup: RelaySetup, spark: Any, table_root: str,
                                                               decode: Callable[[bytes], dict[str, Any]],
                                                               *, seed: int) -> None:
    """A relay of ``setup``'s registry format (``avro``, ``protobuf``) SIGKILLed at two steps under
    concurrent writers loses and duplicates nothing, and Tidemark's ingest of the same format reads
    what it relayed: one row per event of topic order, its payload decoded, nothing quarantined."""
    from outbox.relay import CRASH_POINTS
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    writers = Writers(setup, threads=2, late_rate=0.3, rollback_rate=0.2, pause=0.02, seed=seed).start()
    time.sleep(1.0)
    for point in (CRASH_POINTS[len(CRASH_POINTS) // 2], CRASH_POINTS[-1]):
        code = setup.run(crash_at=point)
        assert code == -9, f"relay was not killed at {point} (exit {code}):\n{setup.log_tail()}"
    writers.stop()
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back, decode=decode)
    assert counts["transactions"] > 0 and setup.outbox_rows() == 0

    topic = f"{setup.prefix}.order"
    config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": f"{table_root}/orders",
                                          "format": setup.relay_format}]})
    report = IngestJob(spark, config, config.pipelines[0], setup.bootstrap).run_bounded()
    expected = {(e[1], e[2]) for t in writers.committed for e in t.events if e[3] == "order"}
    rows = {(r.key, r.seq) for r in spark.read.format("delta").load(f"{table_root}/orders").collect()}
    assert report.quarantined == 0 and rows == expected
