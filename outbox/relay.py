"""The outbox relay: committed outbox rows -> Kafka, one source transaction per Kafka transaction.

Steps of :meth:`Relay.run`, in order:

1. **Fence.** ``init_transactions()`` with ``transactional.id = tidemark-relay-<id>``.
   The broker completes or aborts the previous instance's open transaction and fences
   that instance: anything it tries to commit from now on fails (G5).
2. **Resume.** Read this relay's position, the end LSN of the last source transaction
   it relayed, from the compacted offsets topic, read_committed and to its end. After
   step 1 no transaction of an older instance is pending, so this is the true position.
3. **Capture.** Stream from the replication slot (``outbox.capture``), which restarts at
   the last position confirmed to the server, never after the true position. Source
   transactions arrive whole and in commit order.
4. **Relay.** For each transaction past the position: begin a Kafka transaction;
   produce its events (key ``aggregateid``, value the payload, headers from
   ``outbox.headers``); produce the new position to the offsets topic; commit. Events and
   position become visible together or not at all. Retriable errors are retried, an
   abortable one aborts and redoes the same source transaction, a fatal one or being
   fenced stops the relay (non-zero exit). A transaction at or before the position was
   relayed before a crash and is only acknowledged (step 5). If the connection to Kafka
   was disturbed since the last transaction (``connectors.producer``: without KIP-890 a
   late request could join the next transaction), steps 1 and 2 run again first: a new
   producer instance fences the old one, and the position is read again.
5. **Acknowledge,** every ``ack_every`` transactions and when idle or stopping: delete
   the relayed rows from the outbox table, then confirm the last relayed end LSN to the
   slot so the server can recycle WAL. Rows are deleted only after their Kafka commit,
   and the slot moves only after both, so a crash anywhere here makes step 3 resend
   transactions that step 4 then skips and step 5 finishes.

A source transaction with more than ``relay.max_transaction_events`` events stops the
relay before anything of it is produced (the relay holds one transaction in memory to
count its events per topic); raising the limit and restarting relays it whole.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connectors.producer import TransactionalProducer
from connectors.topic_reader import read_to_end
from outbox import headers as H
from outbox.capture import Capture, SlotBusyError, SourceTransaction, TransactionTooLargeError
from outbox.pgoutput import format_lsn
from outbox.schema import TableName
from tidemark.config import RelayConfig
from tidemark.errors import ConfigError, TerminalError

log = logging.getLogger(__name__)

CRASH_POINTS = ("fenced", "resumed", "produced", "committed", "deleted", "confirmed")

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _crash_point(name: str) -> None:
    """Fault injection for the crash tests: SIGKILL ourselves at a named step."""
    if os.environ.get("TIDEMARK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Position:
    end_lsn: int
    xid: int
    relayed_at: str

    def to_json(self, relay_id: str) -> bytes:
        return json.dumps({"relay": relay_id, "end_lsn": self.end_lsn, "end_lsn_text": format_lsn(self.end_lsn),
                           "xid": self.xid, "relayed_at": self.relayed_at}).encode()


@dataclass
class RelayReport:
    transactions: int = 0
    events: int = 0
    skipped: int = 0
    """Transactions redelivered by the slot that were already in Kafka."""
    deleted: int = 0
    aborted_attempts: int = 0
    refenced: int = 0
    """Times the producer was replaced after a disturbed connection (steps 1-2 again)."""
    topics: Counter[str] = field(default_factory=Counter)


def read_position(client_config: dict[str, Any], offsets_topic: str, relay_id: str,
                  timeout: float = 30.0) -> Position | None:
    """The newest committed position of ``relay_id`` in the offsets topic (read_committed, to its end)."""
    found: Position | None = None
    key = relay_id.encode()
    for record in read_to_end(str(client_config["bootstrap.servers"]), offsets_topic, timeout=timeout,
                              extra=client_config):
        if record.key == key and record.value:
            data = json.loads(record.value)
            candidate = Position(int(data["end_lsn"]), int(data["xid"]), str(data["relayed_at"]))
            if found is None or candidate.end_lsn > found.end_lsn:
                found = candidate
    return found


class Relay:
    def __init__(self, relay: RelayConfig, *, dsn: str, client_config: dict[str, Any], replication_factor: int = 1,
                 topic_partitions: int = 3) -> None:
        self.config = relay
        self.dsn = dsn
        self.client_config = client_config
        self.replication_factor = replication_factor
        self.topic_partitions = topic_partitions
        self.table = TableName.parse(relay.table)
        self.transactional_id = f"tidemark-relay-{relay.id}"
        self.report = RelayReport()
        self._known_topics: set[str] = set()
        self._db = None
        self._pending_ids: list[str] = []
        self._pending_lsn: int | None = None
        self._unacked = 0

    # -- set-up ------------------------------------------------------------------

    def _ensure_topics(self, topics: set[str], *, compacted: bool = False) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        missing = topics - self._known_topics
        if not missing:
            return
        for topic in missing:
            if not _TOPIC.match(topic):
                raise ConfigError(f"{topic!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-'); "
                                  "map its aggregate type to a valid topic under relay.routes")
        admin = AdminClient(self.client_config)
        existing = set(admin.list_topics(timeout=15).topics)
        create = [NewTopic(t, 1 if compacted else self.topic_partitions, self.replication_factor,
                           config={"cleanup.policy": "compact"} if compacted else {})
                  for t in sorted(missing - existing)]
        if create:
            for topic, future in admin.create_topics(create).items():
                try:
                    future.result(30)
                    log.info("created topic %s", topic)
                except Exception as exc:  # noqa: BLE001 - a rival relay may have created it
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise TerminalError(f"cannot create topic {topic}: {exc}; create it or grant CreateTopics")
        self._known_topics |= missing

    def _connect_db(self):  # type: ignore[no-untyped-def]
        import psycopg2

        if self._db is None or self._db.closed:
            self._db = psycopg2.connect(self.dsn)
            self._db.autocommit = True
        return self._db

    def _open_capture(self, stop: threading.Event) -> Capture:
        """Open the slot, waiting out a fenced predecessor that still holds it."""
        capture = Capture(self.dsn, slot=self.config.slot_name, publication=self.config.publication_name,
                          table=self.table, max_events=self.config.max_transaction_events)
        deadline = time.monotonic() + 120
        while True:
            try:
                capture.open()
                return capture
            except SlotBusyError as busy:
                if time.monotonic() > deadline or stop.is_set():
                    raise
                # Step 1 fenced its holder in Kafka; end its session so the slot frees up now.
                if busy.pid:
                    log.warning("slot %s held by server process %d (a fenced relay); terminating that session",
                                self.config.slot_name, busy.pid)
                    with self._connect_db().cursor() as cur:
                        cur.execute("SELECT pg_terminate_backend(%s)", (busy.pid,))
                time.sleep(0.5)

    # -- steps 4 and 5 ------------------------------------------------------------

    def _messages(self, txn: SourceTransaction) -> list[tuple[str, bytes, bytes | None, list[tuple[str, str | bytes | None]]]]:
        topics = [self.config.topic_for(e.aggregatetype) for e in txn.events]
        counts = Counter(topics)
        self._ensure_topics(set(counts))
        shared: list[tuple[str, str | bytes | None]] = [(H.TXID, str(txn.xid).encode()), (H.LSN, format_lsn(txn.commit_lsn).encode()),
                  (H.SIZE, str(len(txn.events)).encode()),
                  (H.TOPIC_COUNTS, json.dumps(dict(sorted(counts.items())), separators=(",", ":")).encode())]
        return [
            (topic, e.aggregateid.encode(), None if e.payload is None else e.payload.encode(),
             [(H.EVENT_ID, e.id.encode()), (H.EVENT_TYPE, e.type.encode()), *shared,
              (H.POSITION, str(i).encode())])
            for i, (topic, e) in enumerate(zip(topics, txn.events, strict=True))
        ]

    def _relay(self, producer: TransactionalProducer, txn: SourceTransaction) -> Position:
        messages = self._messages(txn)
        position = Position(txn.end_lsn, txn.xid, datetime.now(UTC).isoformat())

        def body(p: TransactionalProducer) -> None:
            for topic, key, value, hdrs in messages:
                p.produce(topic, key=key, value=value, headers=hdrs)
            p.produce(self.config.offsets_topic, key=self.config.id.encode(), value=position.to_json(self.config.id))
            _crash_point("produced")

        attempts = producer.run(body, what=f"relaying transaction {txn.xid}",
                                timeout=self.config.transaction_timeout_ms / 1000)
        _crash_point("committed")
        self.report.aborted_attempts += attempts - 1
        self.report.topics.update(m[0] for m in messages)
        return position

    def _acknowledge(self, capture: Capture) -> None:
        if self._pending_lsn is None:
            return
        if self._pending_ids:
            with self._connect_db().cursor() as cur:
                cur.execute(f"DELETE FROM {self.table.sql} WHERE id = ANY(%s::uuid[])", (self._pending_ids,))
                self.report.deleted += cur.rowcount
            _crash_point("deleted")
        capture.confirm(self._pending_lsn)
        _crash_point("confirmed")
        log.debug("acknowledged up to %s", format_lsn(self._pending_lsn))
        self._pending_ids, self._pending_lsn, self._unacked = [], None, 0

    # -- the loop -------------------------------------------------------------------

    def run(self, stop: threading.Event, *, idle_exit: float | None = None) -> RelayReport:
        """Relay until ``stop`` is set (or, with ``idle_exit``, until nothing arrives for that long)."""
        import psycopg2

        producer = TransactionalProducer({
            **self.client_config, "transactional.id": self.transactional_id,
            "transaction.timeout.ms": self.config.transaction_timeout_ms, "linger.ms": 1})
        producer.init()                                                   # step 1
        _crash_point("fenced")
        self._ensure_topics({self.config.offsets_topic}, compacted=True)
        position = read_position(self.client_config, self.config.offsets_topic, self.config.id)  # step 2
        log.info("relay %s resumes after %s", self.config.id, format_lsn(position.end_lsn) if position else "the start")
        _crash_point("resumed")
        capture: Capture | None = None
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    if capture is None:
                        capture = self._open_capture(stop)                # step 3
                    try:
                        txn = capture.next_transaction(timeout=0.5)
                    except TransactionTooLargeError:
                        self._acknowledge(capture)  # what was relayed before it stays done
                        raise
                    if txn is None:
                        self._acknowledge(capture)
                        if idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                            break
                        continue
                    idle_since = time.monotonic()
                    if txn.events and producer.disturbed:
                        position = self._refence(producer)               # steps 1-2 again
                    if (position is not None and txn.end_lsn <= position.end_lsn) or not txn.events:
                        self.report.skipped += bool(txn.events)
                    else:
                        position = self._relay(producer, txn)            # step 4
                        self.report.transactions += 1
                        self.report.events += len(txn.events)
                        log.info("relayed txid %d: %d events, commit LSN %s", txn.xid, len(txn.events),
                                 format_lsn(txn.commit_lsn))
                    self._pending_ids += [e.id for e in txn.events]
                    self._pending_lsn = txn.end_lsn
                    self._unacked += 1
                    if self._unacked >= self.config.ack_every:
                        self._acknowledge(capture)                       # step 5
                except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                    # PostgreSQL restarting or the session ended: reconnect and resume from the slot.
                    # Unacknowledged transactions come again and are skipped by position.
                    log.warning("PostgreSQL connection lost (%s); reconnecting", str(exc).strip().splitlines()[0])
                    if capture is not None:
                        capture.close()
                    capture = None
                    self._db = None
                    self._pending_ids, self._pending_lsn, self._unacked = [], None, 0
                    stop.wait(1.0)
                    # Still ours? A newer relay may have fenced us and ended our session.
                    self._probe_ownership(producer, position)
            if capture is not None:
                self._acknowledge(capture)
        finally:
            if capture is not None:
                capture.close()
            if self._db is not None:
                self._db.close()
            producer.close()
        return self.report

    def _refence(self, producer: TransactionalProducer) -> Position | None:
        """A new producer instance (epoch bump), then the position as the topics now say.

        Read again because the renewal is a fence like any restart's: a relay with this id
        started meanwhile may have moved the position, and it is now fenced in turn.
        """
        producer.renew()
        self.report.refenced += 1
        position = read_position(self.client_config, self.config.offsets_topic, self.config.id)
        log.info("relay %s fenced in again; resumes after %s", self.config.id,
                 format_lsn(position.end_lsn) if position else "the start")
        return position

    def _probe_ownership(self, producer: TransactionalProducer, position: Position | None) -> None:
        """Commit the current position again: a fenced relay fails here and stops (G5).

        A relay that has relayed nothing yet commits position 0, which skips nothing.
        """
        current = position or Position(0, 0, datetime.now(UTC).isoformat())
        producer.run(lambda p: p.produce(self.config.offsets_topic, key=self.config.id.encode(),
                                         value=current.to_json(self.config.id)),
                     what="checking this relay still owns its id")


def relay_status(relay: RelayConfig, *, dsn: str, client_config: dict[str, Any]) -> dict[str, str]:
    """Position, slot state and lag (events not yet relayed, age of the oldest)."""
    import psycopg2

    table = TableName.parse(relay.table)
    position = read_position(client_config, relay.offsets_topic, relay.id)
    status = {"relay": relay.id, "position": format_lsn(position.end_lsn) if position else "(none yet)",
              "last relayed at": position.relayed_at if position else "-"}
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT active, active_pid, confirmed_flush_lsn::text, "
                        "pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) "
                        "FROM pg_replication_slots WHERE slot_name = %s", (relay.slot_name,))
            slot = cur.fetchone()
            if slot is None:
                raise ConfigError(f"replication slot {relay.slot_name!r} does not exist: run `tidemark outbox init`")
            status["slot"] = f"{relay.slot_name} ({'active, pid ' + str(slot[1]) if slot[0] else 'inactive'})"
            status["slot confirmed"] = str(slot[2])
            status["WAL retained"] = str(slot[3])
            cur.execute(f"SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at)) FROM {table.sql}")
            pending, age = cur.fetchone()
            status["lag (events)"] = str(pending)
            status["lag (seconds)"] = f"{float(age):.1f}" if age is not None else "0"
    finally:
        conn.close()
    return status
