"""The outbox relay on a real PostgreSQL and a real broker: committed rows reach Kafka exactly once,
whole and in commit order (G4), and a crash at each named step leaves nothing lost or doubled."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from outbox import wire
from outbox.relay import CRASH_POINTS
from outbox.schema import TableName, add_event, init_outbox
from tests.relay_harness import (
    RelaySetup,
    Writers,
    assert_relayed_exactly_once,
    header,
    kill_group,
)


@pytest.fixture
def setup(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str) -> RelaySetup:
    return RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3)


def test_outbox_init_is_idempotent_and_checks_the_server(postgres_dsn: str, setup: RelaySetup) -> None:
    run = setup.relay_id.removeprefix("r-")
    again = init_outbox(postgres_dsn, table=TableName.parse(setup.table), publication=f"tidemark_r_{run}",
                        slot=f"tidemark_r_{run}")
    assert again == []  # everything already there
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (f"tidemark_r_{run}",))
        assert cur.fetchone() == ("pgoutput",)
        cur.execute("SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = %s",
                    (f"tidemark_r_{run}",))
        assert cur.fetchone() == (True, False, False)  # the relay's own deletes never come back


def test_relays_transactions_with_headers_and_deletes_relayed_rows(setup: RelaySetup) -> None:
    writers = Writers(setup, threads=1, late_rate=0, rollback_rate=0.3, seed=1)
    with setup.connect() as conn:
        import random

        rng = random.Random(1)
        for _ in range(25):
            writers.transaction(conn, rng)
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    assert counts["transactions"] == len(writers.committed) > 10 and writers.rolled_back
    assert setup.outbox_rows() == 0  # housekeeping: every relayed row deleted
    status = subprocess.run([*setup.argv()[:4], "status", "--config", str(setup.config)],
                            check=False, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in status.stdout.splitlines()[2:])
    assert rows["lag (events)"] == "0" and rows["position"] != "(none yet)", status.stdout
    record = setup.records()[0]
    body = json.loads(record.value or b"{}")
    assert record.key == body["key"].encode() and header(record, wire.EVENT_TYPE) == "Changed"
    assert record.topic.startswith(setup.prefix + ".")


def test_commit_order_not_id_order(setup: RelaySetup) -> None:
    """T1 takes its id first, T2 commits first on the same key: the relay follows commit order."""
    with setup.connect() as first, setup.connect() as second, first.cursor() as c1, second.cursor() as c2:
        c1.execute("SELECT pg_current_xact_id()::text::bigint")
        xid1 = int(c1.fetchone()[0])
        c2.execute("SELECT pg_current_xact_id()::text::bigint")
        xid2 = int(c2.fetchone()[0])
        e2 = add_event(c2, "order", "agg-0", "Changed", {"key": "agg-0", "seq": 1}, table=setup.table)
        second.commit()
        e1 = add_event(c1, "order", "agg-0", "Changed", {"key": "agg-0", "seq": 2}, table=setup.table)
        first.commit()
    assert xid1 < xid2
    setup.drain()
    order = [header(r, wire.EVENT_ID) for r in sorted(setup.records(), key=lambda r: r.offset)]
    assert order == [str(e2), str(e1)]


@pytest.mark.parametrize("point", [p for p in CRASH_POINTS])
def test_sigkill_at_each_step_loses_and_duplicates_nothing(setup: RelaySetup, point: str) -> None:
    writers = Writers(setup, threads=2, late_rate=0.3, rollback_rate=0.2, pause=0.02, seed=3).start()
    time.sleep(1.0)
    code = setup.run(crash_at=point)
    assert code == -9, f"relay was not killed at {point} (exit {code}):\n{setup.log_tail()}"
    code = setup.run(crash_at=point)  # and once more, with the previous one's leftovers
    assert code == -9
    writers.stop()
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)
    assert counts["transactions"] > 0
    assert setup.outbox_rows() == 0


def test_a_second_relay_with_the_same_id_fences_the_first(setup: RelaySetup) -> None:
    writers = Writers(setup, threads=2, late_rate=0.2, rollback_rate=0.1, pause=0.05, seed=5).start()
    first = setup.start(log="first.log")
    time.sleep(6)  # the first is relaying
    second = setup.start(log="second.log")
    try:
        code = first.wait(60)
    except Exception:
        kill_group(first)
        raise
    finally:
        writers.stop()
    log = (setup.tmp / "first.log").read_text()
    assert code != 0 and "fenced" in log, f"first relay exited {code}:\n{log[-2000:]}"
    time.sleep(3)
    second.terminate()  # SIGTERM: graceful
    assert second.wait(60) == 0, (setup.tmp / "second.log").read_text()[-2000:]
    setup.drain()
    assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back)


def test_a_50000_event_transaction_is_one_kafka_transaction(setup: RelaySetup) -> None:
    table = TableName.parse(setup.table).sql
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        xid = int(cur.fetchone()[0])
        cur.execute(f"""INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                        SELECT 'bulk', 'agg-' || (i % 8), 'Imported', jsonb_build_object('key', 'bulk', 'seq', i)
                        FROM generate_series(1, 50000) AS i RETURNING id, aggregateid""")
        rows = cur.fetchall()
    setup.drain()
    records = setup.records()
    assert len(records) == 50000
    assert {header(r, wire.SIZE) for r in records} == {"50000"}
    assert {header(r, wire.TXID) for r in records} == {str(xid)}
    assert sorted(int(header(r, wire.POSITION)) for r in records) == list(range(50000))
    by_partition: dict[int, list[int]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r.offset)
    for offsets in by_partition.values():  # one run of consecutive offsets: one Kafka transaction
        assert sorted(offsets) == list(range(min(offsets), min(offsets) + len(offsets)))
    assert {header(r, wire.EVENT_ID) for r in records} == {str(i) for i, _ in rows}
    assert setup.outbox_rows() == 0


def test_a_transaction_over_the_limit_stops_the_relay_and_loses_nothing(setup: RelaySetup, tmp_path: Path) -> None:
    small = setup.with_relay("small.yaml", max_transaction_events=100)
    with setup.connect() as conn, conn.cursor() as cur:
        ids = [str(add_event(cur, "order", "agg-1", "Small", {"key": "agg-1", "seq": 1}, table=setup.table))]
        conn.commit()
        big = [str(add_event(cur, "order", "agg-2", "Big", {"key": "agg-2", "seq": i + 1}, table=setup.table))
               for i in range(150)]
        conn.commit()
    code = small.run("--idle-exit", "3")
    log = small.log_tail()
    assert code == 1 and "max_transaction_events=100" in log, log
    assert [header(r, wire.EVENT_ID) for r in setup.records()] == ids  # the big one: nothing of it
    assert setup.outbox_rows() == 150  # still waiting in the outbox
    setup.drain()  # default limit: relayed whole
    relayed = {header(r, wire.EVENT_ID) for r in setup.records()}
    assert relayed == set(ids) | set(big) and len(setup.records()) == 151


def test_the_relay_places_each_key_where_librdkafka_would(kafka_bootstrap: str) -> None:
    """The relay chooses partitions itself (for its manifest's spans); librdkafka's default partitioner
    placed them before, on a real broker, and the two must agree or per-key order breaks on upgrade."""
    import random
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from outbox.grouping import partition_for

    topic = f"relaytest.placement.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 7, 1)])[topic].result(30)
    rng = random.Random(5)
    keys = [f"agg-{i}".encode() for i in range(200)] + [rng.randbytes(rng.randint(1, 40)) for _ in range(200)]
    placed: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for key in keys:
        producer.produce(topic, b"x", key, on_delivery=lambda err, msg: placed.__setitem__(msg.key(), msg.partition()))
    assert producer.flush(30) == 0
    assert len(placed) == len(keys) and len(set(placed.values())) == 7
    assert {k: partition_for(k, 7) for k in keys} == placed


def test_another_producer_between_the_relays_records_gets_exact_spans(setup: RelaySetup) -> None:
    """A plain producer writes into the relay's partitions while it relays, one record a request on both
    sides, so its records land between the relay's: the relay notices, redoes that group with a report per
    event, and every manifest entry still names exactly where its source transaction's events are."""
    import threading

    from confluent_kafka import Producer

    from outbox.relay import Relay
    from tests.relay_harness import AGGREGATES
    from tidemark.config import load_config

    writers = Writers(setup, threads=1, late_rate=0, rollback_rate=0, seed=3)
    with setup.connect() as conn:
        import random

        rng = random.Random(3)
        for _ in range(60):
            writers.transaction(conn, rng)
    config = load_config(setup.config)
    client = {"bootstrap.servers": setup.bootstrap, "batch.num.messages": 1}
    relay = Relay(config.relay, dsn=setup.dsn, client_config=client)
    topics = sorted(config.relay.topic_for(a) for a in AGGREGATES)
    relay.admission.ensure_topics(set(topics))  # so the other producer has them
    stop, foreign = threading.Event(), Producer({"bootstrap.servers": setup.bootstrap, "linger.ms": 0})

    def interfere() -> None:
        while not stop.is_set():
            for topic in topics:
                for partition in range(3):
                    try:
                        foreign.produce(topic, b"not the relay's", partition=partition)
                    except BufferError:
                        foreign.poll(0.05)
            foreign.poll(0.002)

    thread = threading.Thread(target=interfere, daemon=True)
    thread.start()
    try:
        report = relay.run(threading.Event(), idle_exit=3)
    finally:
        stop.set()
        thread.join(30)
        foreign.flush(30)
    assert report.redone >= 1 and relay._exact_topics, "the other producer's records never landed between"
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back, foreign=True)
    assert counts["transactions"] == 60
