"""The relay under real operating conditions, on a real PostgreSQL and broker:
another relay's open transaction on the shared offsets topic, events Kafka cannot take,
a dropped slot, a slot held by someone else, the offsets topic's shape.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from psycopg2.extras import LogicalReplicationConnection

from outbox import wire
from outbox.position import TAIL, Position, read_position
from outbox.schema import TableName, add_event
from outbox.source import slot_state
from tests.relay_harness import RelaySetup, SourceTxn, assert_relayed_exactly_once, header, kill_group


@pytest.fixture
def setup(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str) -> RelaySetup:
    return RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=1)


def _commit(setup: RelaySetup, events: list[tuple[str, str]], payload_bytes: int = 0) -> SourceTxn:
    """One source transaction of (aggregate type, key) events; keys count their seq like the Writers do."""
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        xid = int(cur.fetchone()[0])
        done = []
        for aggregate, key in events:
            cur.execute(f"UPDATE {setup.keys_table} SET seq = seq + 1 WHERE key = %s RETURNING seq", (key,))
            seq = int(cur.fetchone()[0])
            body = {"key": key, "seq": seq, **({"pad": "x" * payload_bytes} if payload_bytes else {})}
            done.append((str(add_event(cur, aggregate, key, "Changed", body, table=setup.table)), key, seq, aggregate))
    return SourceTxn(xid, done)


def test_a_relay_restarting_behind_another_relays_open_transaction_reads_its_newest_position(
        setup: RelaySetup, kafka_bootstrap: str) -> None:
    first = _commit(setup, [("order", "agg-1"), ("payment", "agg-2")])
    setup.drain()
    # Our relay runs (to die right after its next commit, before acknowledging it) ...
    relay = setup.start(crash_at="committed")
    slot = setup.slot
    _streaming(setup, slot)
    # ... when another relay id on the same offsets topic opens a transaction there and holds it open.
    other = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tidemark-relay-other-{uuid.uuid4().hex[:6]}",
                      "transaction.timeout.ms": 120_000})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(setup.offsets_topic, key=b"other", value=b'{"end_lsn": 1, "xid": 1, "relayed_at": "-"}')
    other.flush(10)
    second = _commit(setup, [("order", "agg-1"), ("shipment", "agg-3")])
    assert relay.wait(120) == -9
    assert setup.outbox_rows() == 2  # in Kafka, not acknowledged: the slot will send it again
    # Its newest position now sits above the other producer's open transaction (above the LSO).
    finisher = threading.Timer(6.0, lambda: other.commit_transaction(30))
    finisher.start()
    try:
        setup.drain()  # must wait for the LSO to pass its newest position, then skip the redelivery
    finally:
        finisher.join()
    assert_relayed_exactly_once(setup, [first, second], set())
    assert setup.outbox_rows() == 0


def _streaming(setup: RelaySetup, slot: str, timeout: float = 120) -> None:
    """Wait until a relay streams from ``slot`` (it has fenced, resumed and opened its capture)."""
    import time

    deadline = time.monotonic() + timeout
    with setup.connect() as conn, conn.cursor() as cur:
        conn.autocommit = True
        while True:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            if cur.fetchone() == (True,):
                return
            assert time.monotonic() < deadline, f"the relay never streamed:\n{setup.log_tail()}"
            time.sleep(0.2)


def test_an_event_kafka_cannot_take_stops_the_relay_until_acknowledged_then_goes_whole_to_the_dead_letters(
        setup: RelaySetup, kafka_bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = f"{setup.prefix}.order"
    for future in admin.create_topics([NewTopic(topic, 3, 1, config={"max.message.bytes": "20000"})]).values():
        future.result(30)
    before = _commit(setup, [("order", "agg-1"), ("payment", "agg-1")])
    poison = _commit(setup, [("payment", "agg-6"), ("order", "agg-6")], payload_bytes=30_000)
    after = _commit(setup, [("order", "agg-3"), ("shipment", "agg-4")])
    code = setup.run("--idle-exit", "3")
    log = setup.log_tail(60)
    big_event = poison.events[1][0]
    assert code == 1 and big_event in log and f"--xid {poison.xid}" in log, log
    relayed = {header(r, wire.EVENT_ID) for r in setup.records()}
    assert relayed == {e[0] for e in before.events}  # nothing of the poison one, nothing after it
    assert setup.run("--idle-exit", "3") == 1  # a restart meets it again, and stops again

    acknowledge = setup.argv()[:4] + ["dead-letter", "--xid", str(poison.xid), "--config", str(setup.config)]
    done = subprocess.run(acknowledge, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "2 event(s)" in done.stdout, done.stdout + done.stderr
    setup.drain()
    assert_relayed_exactly_once(setup, [before, after], set())
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id::text FROM {TableName.parse(setup.table + '_dead_letters').sql}")
        assert {r[0] for r in cur.fetchall()} == {e[0] for e in poison.events}
    assert setup.outbox_rows() == 0
    dead = [e for m in setup.manifests() for e in m.entries if e.dead_lettered]
    assert [d.events for d in dead] == [2] and dead[0].txn.endswith(f"/{poison.xid}")


def test_on_oversized_dead_letter_moves_the_whole_transaction_aside_and_goes_on(
        setup: RelaySetup, kafka_bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(f"{setup.prefix}.shipment", 3, 1,
                                                config={"max.message.bytes": "20000"})]).values():
        future.result(30)
    ok = _commit(setup, [("order", "agg-1")])
    poison = _commit(setup, [("shipment", "agg-7"), ("order", "agg-7")], payload_bytes=25_000)
    later = _commit(setup, [("order", "agg-2"), ("payment", "agg-3")])
    setup.with_relay("dead.yaml", on_oversized="dead_letter").drain()
    assert_relayed_exactly_once(setup, [ok, later], set())
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id::text, reason FROM {TableName.parse(setup.table + '_dead_letters').sql}")
        rows = cur.fetchall()
    assert {r[0] for r in rows} == {e[0] for e in poison.events} and all("max.message.bytes" in r[1] for r in rows)
    assert "ALERT" in setup.log_tail(80)


def test_a_dropped_slot_stops_the_relay_and_reset_relay_requeues_what_remains(setup: RelaySetup) -> None:
    first = _commit(setup, [("order", "agg-1"), ("payment", "agg-2")])
    setup.drain()
    slot = setup.slot
    with setup.connect() as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    lost = [_commit(setup, [("order", "agg-3"), ("shipment", "agg-4")]),
            _commit(setup, [("payment", "agg-3")])]  # while no slot exists: in no stream
    init = setup.argv()[:3] + ["outbox", "init", "--config", str(setup.config)]
    refused = subprocess.run(init, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1 and "--reset-relay" in refused.stderr, refused.stdout + refused.stderr
    code = setup.run("--idle-exit", "3")
    assert code == 1 and "does not exist" in setup.log_tail(), setup.log_tail()
    assert setup.outbox_rows() == 3  # nothing deleted

    reset = subprocess.run([*init, "--reset-relay"], capture_output=True, text=True, timeout=120, check=False)
    assert reset.returncode == 0 and "3 outbox row(s) of 2 source transaction(s) requeued" in reset.stdout, \
        reset.stdout + reset.stderr
    after = _commit(setup, [("order", "agg-1")])
    setup.drain()
    # The requeued transactions are new database transactions (new xids and LSNs), each whole.
    records = setup.records()
    ids = Counter(header(r, wire.EVENT_ID) for r in records)
    assert set(ids) == {e[0] for t in (first, *lost, after) for e in t.events} and max(ids.values()) == 1
    lsn_of = {header(r, wire.EVENT_ID): header(r, wire.LSN) for r in records}
    for txn in lost:
        assert len({lsn_of[e[0]] for e in txn.events}) == 1, f"requeued transaction {txn.xid} split"
    assert len({lsn_of[e[0]] for t in lost for e in t.events}) == 2
    assert setup.outbox_rows() == 0


def test_a_slot_held_by_another_application_is_left_alone(setup: RelaySetup) -> None:
    slot = setup.slot
    other = psycopg2.connect(setup.dsn, connection_factory=LogicalReplicationConnection,
                             application_name="someone-else")
    try:
        cur = other.cursor()
        cur.start_replication(slot_name=slot, decode=False, options={
            "proto_version": "1", "publication_names": slot})
        proc = setup.start()
        try:
            code = proc.wait(150)
        except Exception:
            kill_group(proc)
            raise
        log = setup.log_tail()
        assert code == 75 and "someone-else" in log and "left alone" in log, (code, log)
        assert not other.closed
        with setup.connect() as conn, conn.cursor() as c2:
            c2.execute("SELECT application_name FROM pg_stat_activity s JOIN pg_replication_slots r "
                       "ON r.active_pid = s.pid WHERE r.slot_name = %s", (slot,))
            assert c2.fetchone() == ("someone-else",)
    finally:
        other.close()


def test_the_offsets_topic_is_compacted_and_a_position_is_read_from_the_tail(
        setup: RelaySetup, kafka_bootstrap: str) -> None:
    first = _commit(setup, [("order", "agg-1")])
    setup.drain()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    config = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, setup.offsets_topic)])
    values = {k: v.value for k, v in next(iter(config.values())).result(30).items()}
    assert values["cleanup.policy"] == "compact" and values["segment.ms"] == "3600000", values
    # Far more positions of other relays than the tail read: ours is found by stepping back.
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i in range(5 * TAIL):
        producer.produce(setup.offsets_topic, key=b"someone-else", value=Position(i, i, "-").to_json("someone-else"))
    producer.flush(30)
    ours = read_position({"bootstrap.servers": kafka_bootstrap}, setup.offsets_topic, setup.relay_id)
    assert ours is not None and ours.source is not None and ours.xid == first.xid
    assert read_position({"bootstrap.servers": kafka_bootstrap}, setup.offsets_topic, "nobody") is None


def _slot_confirmed(setup: RelaySetup) -> int:
    with setup.connect() as conn, conn.cursor() as cur:
        confirmed = slot_state(cur, setup.slot).confirmed_flush_lsn
    assert confirmed is not None
    return confirmed


def test_a_slot_moved_on_by_keepalives_while_idle_is_followed(setup: RelaySetup) -> None:
    """psycopg2 moves an idle slot's confirmed position to the server's WAL end on keepalives once
    the relay confirmed all it received; the relay's own position stays at its last group. A
    restart must follow that slot (it skipped nothing), not mistake it for a recreated one."""
    first = _commit(setup, [("order", "agg-1")])
    relay = setup.start()
    try:
        deadline = time.monotonic() + 120
        while setup.outbox_rows() and time.monotonic() < deadline:
            time.sleep(0.5)
        position = read_position({"bootstrap.servers": setup.bootstrap}, setup.offsets_topic, setup.relay_id, wait=30)
        assert position is not None
        # WAL the slot decodes but that carries no event: a rolled-back insert, then unrelated writes.
        with setup.connect() as conn, conn.cursor() as cur:
            add_event(cur, "order", "agg-2", "Changed", {"never": True}, table=setup.table)
            conn.rollback()
        while _slot_confirmed(setup) <= position.end_lsn and time.monotonic() < deadline:
            with setup.connect() as conn, conn.cursor() as cur:
                cur.execute(f"UPDATE {setup.keys_table} SET seq = seq WHERE key = 'agg-1'")
            time.sleep(1)
        assert _slot_confirmed(setup) > position.end_lsn, "the slot never moved past the position while idle"
        relay.terminate()
        assert relay.wait(60) == 0, setup.log_tail()
    finally:
        if relay.poll() is None:
            kill_group(relay)
    after = _commit(setup, [("payment", "agg-3")])
    setup.drain()  # exits 0: the slot is followed
    ids = Counter(header(r, wire.EVENT_ID) for r in setup.records())
    assert set(ids) == {e[0] for t in (first, after) for e in t.events} and max(ids.values()) == 1


def test_a_slot_moved_past_rows_it_never_delivered_stops_the_relay(setup: RelaySetup) -> None:
    """Someone advances the slot past committed outbox rows the relay never saw: those rows are in
    no stream. The relay must stop with their count and an id, deleting nothing."""
    _commit(setup, [("order", "agg-1")])
    setup.drain()
    lost = _commit(setup, [("order", "agg-2"), ("payment", "agg-3")])
    slot = setup.slot
    with setup.connect() as conn, conn.cursor() as cur:
        conn.autocommit = True
        for _ in range(2):  # a running-xacts record past the rows, then an advance that confirms it
            cur.execute("CHECKPOINT")
            cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
    code = setup.run("--idle-exit", "3")
    assert code == 1 and "passed 2 outbox row(s) it never delivered" in setup.log_tail(), setup.log_tail()
    assert setup.outbox_rows() == 2  # nothing deleted
    assert not ({e[0] for e in lost.events} & {header(r, wire.EVENT_ID) for r in setup.records()})
