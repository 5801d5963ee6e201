"""The outbox relay: committed outbox rows -> Kafka, each source transaction inside one Kafka transaction.

Steps of :meth:`Relay.run`, in order, with what a crash right after each leaves behind
(``TIDEMARK_CRASH_AT`` names them; docs/design.md has the full table):

1. **Fence.** ``init_transactions()`` with ``transactional.id = tidemark-relay-<id>``.
   The broker completes or aborts the previous instance's open transaction and fences
   that instance: anything it tries to commit from now on fails (G5). *fenced*: nothing new.
2. **Resume.** Read this relay's position from the offsets topic (``outbox.position``):
   the end LSN of the last source transaction relayed, and the stream it counts in. Read
   past the high watermark seen after the fence, so no open transaction of another
   producer hides it. An answer without the topic, its partition or a leader, or a position
   older than one this process committed or read before, is a broker still settling after a
   pause or restart (transient), never "relay from the slot's start"; an older position that
   outlasts the read's own wait is believed, with an alert. *resumed*: nothing new.
3. **Capture.** Connect to the slot, check the server is the position's stream (same
   system, a timeline that did not fork before the position, a slot that exists, is
   valid and has not confirmed past the position: ``outbox.source``), then stream; the
   slot restarts at its last confirmed position, never after the true one. Source
   transactions arrive whole and in commit order.
4. **Group.** Consecutive source transactions past the position join one group until
   the linger, the event, byte or transaction limit, or an idle slot closes it
   (``relay.group``). Never split: one larger than the limits goes alone. A transaction
   with an event larger than Kafka takes is refused whole (``relay.on_oversized``),
   before anything of it is produced.
5. **Relay** the group as one Kafka transaction, opened when its first source transaction
   arrives: its events, each source transaction's as it joins the group (key
   ``aggregateid``, value the payload, headers from ``outbox.wire``; the partition
   chosen here as librdkafka's default partitioner would, so each event's index in its
   partition is known), then, at the close, from the delivery reports of each
   partition's first and last event, the manifest (when the first reports all came in
   while the group filled, it is produced at once and the last ones are checked before
   the commit: one wait for everything's acknowledgements)
   (``outbox.manifest``: each source transaction's exact spans; a partition another
   producer wrote into meanwhile makes the group redo with a report per event), then the
   new position, then commit. Events, manifest and position become visible together or
   not at all. *produced*, *manifested*, *positioned*: an open transaction, aborted by
   the next fence; the slot resends and it is relayed again. *committed*: all in Kafka;
   the slot resends it and step 4 skips it by position (only step 6 is left).
   An abortable error or a commit of unknown outcome (a timeout, a lost connection)
   is never redone blindly: the relay fences again (a new producer epoch), reads its
   position back and reopens the slot, so the group is relayed again only if it did not
   commit. If the Kafka connection was disturbed since the last group
   (``connectors.producer``: without KIP-890 a late request could join the next
   transaction), steps 1 and 2 run again before the next group opens. A PostgreSQL
   connection lost while a group is open aborts it; the slot resends its transactions.
6. **Acknowledge,** every ``ack_every`` source transactions and when idle or stopping:
   delete the relayed rows from the outbox table, then confirm the last relayed end LSN
   to the slot so the server can recycle WAL. *deleted*: rows gone, slot behind: the
   slot resends, step 4 skips, the delete repeats as a no-op. *confirmed*: done. The slot
   never moves past the position in Kafka (step 3 relies on it).

Kafka being unavailable (calls failing for ``relay.kafka_retry_seconds``) is not a
reason to stop: the relay steps back, waits (doubling up to 30 s, from 1 s again once a
group has committed since), and resumes from step 1. Nor is a schema registry that does not
answer a lookup step 4 needs (``relay.format: avro``, ``protobuf``): the same wait, counted
as the registry's. Only being fenced, a changed source
stream, a refused event or bad configuration stop it (non-zero exit).

The relay owns one object per helper concern, each holding its own state:
:class:`~outbox.admission.Admission` (each event's topic, the topics' limits and partition
counts, a refused or dead-lettered transaction), :class:`~outbox.grouping.Staging` (a source
transaction's events staged into its group's Kafka transaction), and
:class:`~outbox.outage.Backoff` with :class:`~outbox.outage.RegistryWaits` (how long to wait
after an outage, the registry's wait named, when a failing group is given up on).
``outbox.grouping`` also says what a group holds and when it is full; ``outbox.status`` shows a
relay from outside. The order of the steps, the loop of sessions and what a crash after each
step leaves are only here.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import UTC, datetime
from functools import partial
from typing import Any

from connectors.preflight import postgres_refusal, require_operation
from connectors.producer import (
    CommitOutcomeUnknownError,
    KafkaUnavailableError,
    TransactionAbortedError,
    TransactionalProducer,
)
from outbox.admission import Admission
from outbox.capture import (
    Capture,
    ReplicationLostError,
    SlotBusyError,
    SourceTransaction,
    TransactionTooLargeError,
)
from outbox.deadletter import RefusedTransactionError
from outbox.grouping import Group, Staging, collector_for_groups
from outbox.manifest import InterleavedError, Placement
from outbox.outage import Backoff, RegistryWaits
from outbox.payloads import PayloadEncoder, RegistryOutage
from outbox.pgoutput import format_lsn
from outbox.position import (
    Position,
    PositionUnreadableError,
    Source,
    offsets_partition,
    read_position,
    resumed,
)
from outbox.report import RelayReport
from outbox.schema import TableName
from outbox.source import verify
from outbox.status import relay_backlog, relay_status
from outbox.wire import SUMMARY_HEADER
from tidemark.config import RelayConfig
from tidemark.errors import KafkaAccessError, ServiceUnavailableError, TerminalError

__all__ = ["CRASH_POINTS", "Relay", "RelayReport", "relay_backlog", "relay_status"]

log = logging.getLogger(__name__)

CRASH_POINTS = ("fenced", "resumed", "produced", "manifested", "positioned", "committed", "deleted", "confirmed")


def _crash_point(name: str) -> None:
    """Fault injection for the crash tests: SIGKILL ourselves at a named step."""
    if os.environ.get("TIDEMARK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Relay:
    """The relay protocol: the steps above, in :meth:`_session`, run by :meth:`run` until stopped."""

    def __init__(self, relay: RelayConfig, *, dsn: str, client_config: dict[str, Any],
                 replication_factor: int | None = None, topic_partitions: int | None = None,
                 encoder: PayloadEncoder | None = None) -> None:
        self.config = relay
        self.dsn = dsn
        self.client_config = client_config
        self.table = TableName.parse(relay.table)
        self.transactional_id = relay.transactional_id
        self.report = RelayReport()
        self.registry = RegistryWaits(self.report)
        self.backoff = Backoff(self.report, self.registry)
        self.admission = Admission(relay, client_config, table=self.table,
                                   dead_letters=TableName.parse(relay.dead_letter_table), report=self.report,
                                   db=self._connect_db, encoder=encoder, waits=self.registry,
                                   replication_factor=replication_factor, topic_partitions=topic_partitions)
        self.staging = Staging(relay.id, self.admission.partition_counts)
        self._exact_topics: set[str] = set()
        """Topics another producer writes into as well: every event there gets a delivery report."""
        self._db = None
        self._pending_ids: list[bytes] = []
        self._pending_lsn: int | None = None
        self._unacked = 0
        self._offsets_partition = 0
        self.position: Position | None = None
        """The newest position this relay knows is committed: set at each commit and each resume,
        so nothing that fails after a commit (an acknowledgement, say) can leave it stale."""
        self._older_since: float | None = None
        """Since when the offsets topic has answered a position older than :attr:`position` (see :meth:`_resume`)."""

    # -- set-up ------------------------------------------------------------------

    def _connect_db(self):  # type: ignore[no-untyped-def]
        import psycopg2

        if self._db is None or self._db.closed:
            self._db = psycopg2.connect(self.dsn)
            self._db.autocommit = True
        return self._db

    def _open_capture(self, stop: threading.Event, position: Position | None) -> Capture:
        """Step 3: connect, check the stream against the position, then stream (waiting out a fenced predecessor)."""
        capture = Capture(self.dsn, slot=self.config.slot_name, publication=self.config.publication_name,
                          table=self.table, max_events=self.config.max_transaction_events,
                          max_bytes=int(self.config.max_transaction_bytes), application_name=self.transactional_id)
        deadline = time.monotonic() + 120
        while True:
            source = capture.connect()
            slot = capture.slot_state(position.end_lsn if position else None)
            recorded = position.source if position else None
            fork = None
            if recorded is not None and recorded.timeline < source.timeline:
                fork = capture.fork_point(recorded.timeline)
            try:
                verify(position, source, slot, fork)
            except TerminalError:
                capture.close()
                raise
            try:
                capture.start()
                return capture
            except SlotBusyError as busy:
                if time.monotonic() > deadline or stop.is_set():
                    raise
                self._end_fenced_session(busy)
                time.sleep(0.5)

    # -- step 5 ------------------------------------------------------------------------

    def _open(self, producer: TransactionalProducer, group: Group) -> None:
        """Begin the group's Kafka transaction (after a fence, if the connection was disturbed since the last)."""
        if producer.disturbed:
            self._refence(producer)                                            # steps 1-2 again
            position = self.position
            done = [t for t in group.txns if position is not None and t.end_lsn <= position.end_lsn]
            if done:  # another instance with this id relayed them meanwhile
                self.report.skipped += sum(1 for t in done if t.events)
                self._pend(done)
                group.txns = group.txns[len(done):]
                group.dead = {i - len(done) for i in group.dead if i >= len(done)}
        if not group.txns:
            return
        self.admission.recount_partitions()
        producer.begin()
        group.placement, group.open = Placement(frozenset(self._exact_topics)), True

    def _relay(self, producer: TransactionalProducer, group: Group, source: Source | None) -> None:
        """Close the group's Kafka transaction: held events, manifest, position, commit (then :attr:`position`)."""
        if group.placement is None:
            self._open(producer, group)
            if not group.txns:
                return
        placement = group.placement
        assert placement is not None
        last = group.txns[-1]
        position = Position(last.end_lsn, last.xid, datetime.now(UTC).isoformat(), source)

        def body(p: TransactionalProducer) -> None:
            self.staging.send(p, group)
            sent = placement.sent  # each held event is its partition's last: index sent - 1
            p.produce_all((topic, partition, key, value, headers,
                           report or partial(group.delivered, (topic, partition), sent[(topic, partition)] - 1))
                          for topic, partition, key, value, headers, report in group.held.values())
            _crash_point("produced")
            # With every partition's first offset reported while the group filled, the manifest
            # is written now, and the last events' acknowledgements, the manifest and the
            # position travel together: one wait before the commit instead of two. The last
            # offsets are still checked before the commit (an interleaved partition aborts it).
            early = placement.ready(group.offsets)
            if not early:
                self._await_deliveries(p, group)
            dead = group.dead
            manifest, summary = placement.encode(self.config.id, format_lsn(position.end_lsn), (
                (f"{format_lsn(t.commit_lsn)}/{t.xid}", len(t.events), i in dead)
                for i, t in enumerate(group.txns) if t.events), group.offsets, verify=not early)
            p.produce(self.config.manifest_topic, key=self.config.id.encode(), value=manifest,
                      headers=[(SUMMARY_HEADER, summary)])
            _crash_point("manifested")
            p.produce(self.config.offsets_topic, key=self.config.id.encode(), value=position.to_json(self.config.id),
                      partition=self._offsets_partition)
            _crash_point("positioned")
            if early:
                self._await_deliveries(p, group)
                placement.verify(group.offsets)

        try:
            producer.within(body, what=f"relaying {len(group.txns)} source transaction(s) up to "
                            f"{format_lsn(last.end_lsn)}", commit=True,
                            timeout=self.config.transaction_timeout_ms / 1000)
        except InterleavedError as interleaved:  # uncommitted: the redo asks for a report per event there
            self._exact_topics |= interleaved.topics
            raise
        group.open = False
        group.release()
        self.position = position
        _crash_point("committed")
        self.report.kafka_transactions += 1
        for i, txn in enumerate(group.txns):
            if i in group.dead:
                self.report.dead_lettered += 1
            elif txn.events:
                self.report.transactions += 1
                self.report.events += len(txn.events)
        for (topic, _), n in placement.sent.items():
            self.report.topics[topic] += n
        log.debug("relayed %d source transaction(s), %d events, up to %s", len(group.txns), group.events,
                  format_lsn(last.end_lsn))

    def _await_deliveries(self, p: TransactionalProducer, group: Group) -> None:
        """Wait for the acknowledgements of everything the group produced; a failed one aborts it."""
        p.flush(self.config.transaction_timeout_ms / 1000)
        if group.failed:  # a missing ACL no redo can mend? (librdkafka reports only "purged" then)
            try:
                require_operation(self.client_config, sorted({f.split(": ", 1)[0] for f in group.failed}),
                                  "WRITE", role="the relay's")
            except KafkaAccessError:
                try:  # now, not at the transaction's timeout, where the instance still can
                    p.abort(10)
                except Exception as exc:  # noqa: BLE001 - a refused write may leave it fatal: the ACL is the news
                    log.debug("aborting after a refused write: %s", exc)
                raise
            raise TransactionAbortedError(f"{len(group.failed)} event(s) not delivered, e.g. {group.failed[0]}")
        if group.unknown:  # delivered, but where is not known: the redo asks again
            raise TransactionAbortedError(f"{group.unknown} event(s) delivered without an offset in the report "
                                          "(a retried batch the broker already had); the manifest's spans are "
                                          "unknown, so the transaction is redone")

    # -- step 6 ------------------------------------------------------------------------

    def _pend(self, txns: list[SourceTransaction]) -> None:
        for txn in txns:
            self._pending_ids += [e.id for e in txn.events]
            self._pending_lsn = txn.end_lsn
            self._unacked += 1

    def _acknowledge(self, capture: Capture) -> None:
        if self._pending_lsn is None:
            return
        if self._pending_ids:
            with self._connect_db().cursor() as cur:
                cur.execute(f"DELETE FROM {self.table.sql} WHERE id = ANY(%s::uuid[])",
                            ([i.decode() for i in self._pending_ids],))
                self.report.deleted += cur.rowcount
            _crash_point("deleted")
        capture.confirm(self._pending_lsn)
        _crash_point("confirmed")
        log.debug("acknowledged up to %s", format_lsn(self._pending_lsn))
        self._pending_ids, self._pending_lsn, self._unacked = [], None, 0

    # -- the loop ----------------------------------------------------------------------

    def run(self, stop: threading.Event, *, idle_exit: float | None = None) -> RelayReport:
        """Relay until ``stop`` is set (or, with ``idle_exit``, until nothing arrives for that long).

        Sessions (steps 1-6) until one ends by itself: after an outage the relay steps back and
        starts the next (:attr:`backoff`); after a failed group it starts the next at once (a
        fence, a fresh position)."""
        with collector_for_groups():
            while not stop.is_set():
                try:
                    self._session(stop, idle_exit)
                    return self.report
                except RegistryOutage as outage:
                    stop.wait(self.backoff.registry_down(outage))
                except (KafkaUnavailableError, PositionUnreadableError, ServiceUnavailableError) as outage:
                    stop.wait(self.backoff.kafka_down(outage))
                except (TransactionAbortedError, CommitOutcomeUnknownError) as error:
                    self.backoff.group_failed(error)
        return self.report

    def _session(self, stop: threading.Event, idle_exit: float | None) -> None:
        """Steps 1-6 until stopped or idle; a Kafka failure ends the session (``run`` starts the next)."""
        import psycopg2

        producer = TransactionalProducer({
            **self.client_config, "transactional.id": self.transactional_id,
            "transaction.timeout.ms": self.config.transaction_timeout_ms, "linger.ms": 5},
            retry_for=self.config.kafka_retry_seconds)
        capture: Capture | None = None
        self._pending_ids, self._pending_lsn, self._unacked = [], None, 0
        try:
            producer.init(timeout=self.config.kafka_retry_seconds)             # step 1
            _crash_point("fenced")
            self.admission.ensure_topics({self.config.offsets_topic}, compacted=True)
            self.admission.ensure_topics({self.config.manifest_topic}, single=True)
            self._resume()                                                     # step 2
            _crash_point("resumed")
            group = Group()
            idle_since = time.monotonic()
            linger = self.config.group.linger_ms / 1000
            while not stop.is_set():
                try:
                    if capture is None:
                        capture = self._open_capture(stop, self.position)     # step 3
                    wait = max(0.0, group.opened + linger - time.monotonic()) if group.txns else 0.5
                    try:
                        txn = capture.next_transaction(timeout=wait)
                    except TransactionTooLargeError:
                        if group.txns:
                            self._flush(producer, group, capture)
                        self._acknowledge(capture)  # what was relayed before it stays done
                        raise
                    if txn is None:
                        if group.txns:
                            self._flush(producer, group, capture)              # step 5
                            group = Group()
                            continue
                        self._acknowledge(capture)                             # step 6, idle
                        if idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                            break
                        continue
                    idle_since = time.monotonic()
                    if self.position is not None and txn.end_lsn <= self.position.end_lsn:
                        self.report.skipped += bool(txn.events)  # redelivered: already in Kafka
                        self._pend([txn])
                        continue
                    limits = self.config.group
                    if group.overflows(txn, limits):
                        self._flush(producer, group, capture)
                        group = Group()
                    try:
                        topics = self.admission.routed(txn)                    # step 4
                        admitted = self.admission.admit(txn, topics) if topics else True
                        if admitted and topics and self.admission.encoder is not None:
                            encoded = self.admission.encoded(txn, topics)
                            txn, admitted = (txn, False) if encoded is None else (encoded, True)
                    except RefusedTransactionError:
                        if group.txns:
                            self._flush(producer, group, capture)
                        self._acknowledge(capture)
                        raise
                    group.add(txn, dead=not admitted)
                    if admitted and txn.events:
                        if group.placement is None:
                            self._open(producer, group)
                        if group.txns and group.txns[-1] is txn:  # else relayed by another instance meanwhile
                            self.staging.stage(producer, group, txn, topics)   # step 5, as it joins
                    if group.full(linger, limits):
                        self._flush(producer, group, capture)
                        group = Group()
                except (psycopg2.OperationalError, psycopg2.InterfaceError, ReplicationLostError) as exc:
                    # PostgreSQL restarting or the session ended: reconnect and resume from the slot.
                    self._postgres_lost(exc, producer, capture, group, stop)
                    capture, group = None, Group()
            if capture is not None:
                if group.txns:
                    self._flush(producer, group, capture)
                self._acknowledge(capture)
        finally:
            if capture is not None:
                capture.close()
            if self._db is not None:
                self._db.close()
                self._db = None
            producer.close()

    def _flush(self, producer: TransactionalProducer, group: Group, capture: Capture) -> None:
        """Step 5 for ``group``, then step 6 when due."""
        self._relay(producer, group, capture.source)                           # step 5
        if not group.txns:
            return
        self._pend(group.txns)
        if self._unacked >= self.config.ack_every:
            self._acknowledge(capture)                                         # step 6

    def _resume(self) -> None:
        """Step 2: never from a position older than one known here (:func:`outbox.position.resumed`) while
        the topic may still be settling; past that window an older answer is the truth after all (a
        commit Kafka acknowledged is not there), and resuming from it lets the slot resend what it
        holds, so that nothing it still has is lost; an alert says so."""
        settle = 2 * self.config.transaction_timeout_ms / 1000 + 30
        read = read_position(self.client_config, self.config.offsets_topic, self.config.id, wait=settle, exists=True)
        try:
            self.position = resumed(self.position, read, self.config.offsets_topic)
            self._older_since = None
        except PositionUnreadableError:
            now = time.monotonic()
            self._older_since = self._older_since or now
            if now - self._older_since < settle:
                raise
            log.error("ALERT relay %s: the offsets topic has answered position %s for %.0f s, older than %s, which "
                      "Kafka acknowledged as committed; resuming from it: the slot resends what it has not "
                      "confirmed, and what Kafka does hold of that goes again (ingest with dedup drops the copies)",
                      self.config.id, format_lsn(read.end_lsn) if read else "(none)", now - self._older_since,
                      format_lsn(self.position.end_lsn) if self.position else "?")
            self.position, self._older_since = read, None
        # Where read_position looks: an offsets topic made elsewhere may have more than one partition.
        self._offsets_partition = offsets_partition(self.config.id, self.admission.partitions(self.config.offsets_topic) or 1)
        log.info("relay %s resumes after %s", self.config.id,
                 format_lsn(self.position.end_lsn) if self.position else "the start")

    # -- after a failure: fencing again, PostgreSQL lost, a fenced session ------------

    def _refence(self, producer: TransactionalProducer) -> None:
        """A new producer instance (epoch bump), then the position as the topics now say.

        Read again because the renewal is a fence like any restart's: a relay with this id
        started meanwhile may have moved the position, and it is now fenced in turn.
        """
        producer.renew()
        self.report.refenced += 1
        self._resume()

    def _probe_ownership(self, producer: TransactionalProducer) -> None:
        """Commit the current position again: a fenced relay fails here and stops (G5).

        A relay that has relayed nothing yet commits position 0, which skips nothing.
        """
        current = self.position or Position(0, 0, datetime.now(UTC).isoformat())
        producer.run(lambda p: p.produce(self.config.offsets_topic, key=self.config.id.encode(),
                                         value=current.to_json(self.config.id), partition=self._offsets_partition),
                     what="checking this relay still owns its id")

    def _postgres_lost(self, exc: Exception, producer: TransactionalProducer, capture: Capture | None,
                       group: Group, stop: threading.Event) -> None:
        """After a PostgreSQL error in a session: stop on a refusal, else close the capture, abort the open
        group, wait and check this relay still owns its id; the caller starts over with a new capture and
        group."""
        # PostgreSQL restarting or the session ended: reconnect and resume from the slot.
        # Unacknowledged transactions come again and are skipped by position. A refused
        # login or certificate (a password rotated under us) is no outage: it stops.
        refusal = postgres_refusal(exc, self.dsn)
        if refusal is not None:
            if group.open:
                producer.abort(self.config.transaction_timeout_ms / 1000)
            raise refusal from None
        log.warning("PostgreSQL connection lost (%s); reconnecting", str(exc).strip().splitlines()[0])
        if capture is not None:
            capture.close()
        if group.open:
            producer.abort(self.config.transaction_timeout_ms / 1000)  # its events come again
        self._db = None
        self._pending_ids, self._pending_lsn, self._unacked = [], None, 0
        stop.wait(1.0)
        # Still ours? A newer relay may have fenced us and ended our session.
        self._probe_ownership(producer)

    def _end_fenced_session(self, busy: SlotBusyError) -> None:
        """End the session holding the slot if it is a relay with this id (step 1 fenced it); else wait."""
        if not busy.pid:
            return
        with self._connect_db().cursor() as cur:
            cur.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (busy.pid,))
            row = cur.fetchone()
            if row is None:
                return  # gone already
            if row[0] != self.transactional_id:
                raise SlotBusyError(self.config.slot_name, busy.pid, holder=row[0])
            log.warning("slot %s held by server process %d (a fenced relay with this id); ending that session",
                        self.config.slot_name, busy.pid)
            cur.execute("SELECT pg_terminate_backend(%s)", (busy.pid,))

