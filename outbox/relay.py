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
   ``aggregateid``, value the payload, headers from ``outbox.headers``; the partition
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
group has committed since), and resumes from step 1. Only being fenced, a changed source
stream, a refused event or bad configuration stop it (non-zero exit).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import signal
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors.preflight import GRANT_HINT, postgres_refusal, require_operation
from connectors.producer import (
    CommitOutcomeUnknownError,
    KafkaUnavailableError,
    ProducerFatalError,
    TransactionAbortedError,
    TransactionalProducer,
)
from outbox import headers as H
from outbox.capture import (
    Capture,
    ReplicationLostError,
    SlotBusyError,
    SourceTransaction,
    TransactionTooLargeError,
)
from outbox.deadletter import OversizedEventError, acknowledged, dead_letter_events
from outbox.manifest import SUMMARY_HEADER, InterleavedError, Placement, TopicPartition
from outbox.pgoutput import format_lsn
from outbox.position import (
    OFFSETS_TOPIC_CONFIG,
    Position,
    PositionUnreadableError,
    Source,
    offsets_partition,
    read_position,
    resumed,
)
from outbox.schema import TableName
from outbox.source import verify
from tidemark.config import RelayConfig
from tidemark.errors import ConfigError, KafkaAccessError, ServiceUnavailableError, TerminalError

log = logging.getLogger(__name__)

CRASH_POINTS = ("fenced", "resumed", "produced", "manifested", "positioned", "committed", "deleted", "confirmed")

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

#: Bytes a record adds to its key, value and headers on the wire (record and batch headers), rounded up.
RECORD_OVERHEAD = 512

#: librdkafka's default ``message.max.bytes``; the producer refuses anything larger.
PRODUCER_MESSAGE_MAX = 1_000_000

#: Failed attempts at the same group, each after a fence and a fresh position, before the relay gives up.
MAX_REDOS = 10

#: How often the relay reads its topics' partition counts again (librdkafka's own metadata refresh).
PARTITIONS_REFRESH_SECONDS = 300.0

#: Staged events handed to librdkafka at a time: one call per batch, not per source transaction.
SEND_BATCH = 512

#: The collector's young-generation threshold while the relay runs (Python's default is 700).
#: A group holds its source transactions' events until its commit, some 20,000 tracked objects
#: at the default limits; with the default threshold the collector walked them again at every
#: young collection and promoted them to be walked again, 0.26-0.30 s of CPU per 200,000
#: events (5 %; docs/benchmarks.md, session 29). Reference counting frees a group at its commit
#: (:meth:`Group.release` breaks its one cycle); the collector only has the rare cycles left to find.
YOUNG_GC_THRESHOLD = 50_000


def _admin_call(call: Callable[[], Any]) -> Any:
    """A metadata request; no answer is an outage (transient), not a crash."""
    try:
        return call()
    except KafkaException as exc:
        raise KafkaUnavailableError(f"Kafka metadata request failed: {exc.args[0]}") from None


def partition_for(key: bytes, partitions: int) -> int:
    """The partition librdkafka's default partitioner (``consistent_random``) gives ``key``: its CRC-32
    modulo the partition count. The relay places events itself (``outbox.manifest.Placement``) exactly
    as it did when librdkafka placed them, so per-key order holds across an upgrade; only an empty key,
    which librdkafka would place at random, goes to partition 0."""
    return zlib.crc32(key) % partitions


@contextmanager
def collector_for_groups() -> Iterator[None]:
    """Run with :data:`YOUNG_GC_THRESHOLD`, then put the caller's thresholds back."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], YOUNG_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _crash_point(name: str) -> None:
    """Fault injection for the crash tests: SIGKILL ourselves at a named step."""
    if os.environ.get("TIDEMARK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class RelayReport:
    transactions: int = 0
    events: int = 0
    kafka_transactions: int = 0
    """Groups committed (each one Kafka transaction)."""
    skipped: int = 0
    """Transactions redelivered by the slot that were already in Kafka."""
    deleted: int = 0
    dead_lettered: int = 0
    """Source transactions moved to the dead letters instead of Kafka."""
    redone: int = 0
    """Groups relayed again after an abort or a commit of unknown outcome (each after a fence)."""
    refenced: int = 0
    """Times the producer was replaced after a disturbed connection (steps 1-2 again)."""
    outages: int = 0
    """Times Kafka was unavailable and the relay stepped back."""
    topics: Counter[str] = field(default_factory=Counter)


#: An event as :meth:`TransactionalProducer.produce_all` takes it: (topic, partition, key, value,
#: headers, the callback for its delivery report, or None when the manifest does not need it).
Staged = tuple[str, int, bytes, bytes | None, list[Any], Any]


@dataclass
class Group:
    """Consecutive source transactions bound for one Kafka transaction (step 4)."""

    txns: list[SourceTransaction] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    """Indexes of ``txns`` that go to the dead letters, not to Kafka."""
    events: int = 0
    size: int = 0
    opened: float = 0.0
    placement: Placement | None = None
    """Set once its Kafka transaction is open: where its events went, by index in their partition."""
    open: bool = False
    """Its Kafka transaction is open (begun, not yet committed)."""
    held: dict[TopicPartition, Staged] = field(default_factory=dict)
    """Each partition's newest event, produced when the next one comes or at the close: only then is it
    known to be the partition's last, whose delivery report the manifest needs (given at the close)."""
    offsets: dict[TopicPartition, dict[int, int]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    unknown: int = 0
    """Delivered events whose report came without an offset: librdkafka reports none for a retried
    batch the broker had already written (a duplicate sequence). Their spans are unknown, so the
    group cannot commit its manifest (see :meth:`Relay._await_deliveries`)."""
    unsent: list[Staged] = field(default_factory=list)
    """Events staged but not yet handed to librdkafka (they go in batches of :data:`SEND_BATCH`)."""

    def delivered(self, tp: TopicPartition, index: int, err: Any, msg: Any) -> None:
        """A delivery report of an event the manifest needs the offset of."""
        if err is not None:
            self.failed.append(f"{msg.topic()}: {err.name() if isinstance(err, KafkaError) else err}")
        elif (offset := msg.offset()) is None or offset < 0:
            self.unknown += 1
        else:
            self.offsets[tp][index] = offset

    def release(self) -> None:
        """Drop the staged events once the group is committed. Their report callbacks refer back
        to the group: left in place, that cycle would keep the group and all its transactions
        alive until the cyclic collector ran, which the relay makes rare (:data:`YOUNG_GC_THRESHOLD`)."""
        self.held.clear()
        self.unsent.clear()

    def add(self, txn: SourceTransaction, *, dead: bool = False) -> None:
        if not self.txns:
            self.opened = time.monotonic()
        if dead:
            self.dead.add(len(self.txns))
        self.txns.append(txn)
        self.events += len(txn.events)
        self.size += txn.size

    @property
    def end_lsn(self) -> int:
        return self.txns[-1].end_lsn


class Relay:
    def __init__(self, relay: RelayConfig, *, dsn: str, client_config: dict[str, Any],
                 replication_factor: int | None = None, topic_partitions: int | None = None) -> None:
        self.config = relay
        self.dsn = dsn
        self.client_config = client_config
        self.replication_factor = replication_factor or relay.replication_factor
        self.topic_partitions = topic_partitions or relay.topic_partitions
        self.table = TableName.parse(relay.table)
        self.dead_letters = TableName.parse(relay.dead_letter_table)
        self.transactional_id = relay.transactional_id
        self.report = RelayReport()
        self._known_topics: set[str] = set()
        self._limits: dict[str, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._counted_at = 0.0
        self._exact_topics: set[str] = set()
        """Topics another producer writes into as well: every event there gets a delivery report."""
        self._counts_json: dict[tuple[tuple[str, int], ...], bytes] = {}
        self._routes: dict[bytes, str] = {}
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

    def _ensure_topics(self, topics: set[str], *, compacted: bool = False, single: bool = False) -> None:
        """Create missing topics (shape from the config, else the cluster's defaults); learn each one's size limit.

        ``compacted`` (the offsets topic) and ``single`` (the manifest, read in order) get one partition.
        """
        missing = topics - self._known_topics
        if not missing:
            return
        from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

        for topic in missing:
            if not _TOPIC.match(topic):
                raise ConfigError(f"{topic!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-'); "
                                  "map its aggregate type to a valid topic under relay.routes")
        admin = AdminClient(self.client_config)
        existing = set(_admin_call(lambda: admin.list_topics(timeout=15)).topics)
        config: dict[str, str] = dict(OFFSETS_TOPIC_CONFIG) if compacted else {}
        if self.config.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.config.min_insync_replicas)
        create = [NewTopic(t, 1 if compacted or single else (self.topic_partitions or -1),
                           self.replication_factor or -1, config=config) for t in sorted(missing - existing)]
        if create:
            for topic, future in admin.create_topics(create).items():
                try:
                    future.result(30)
                    log.info("created topic %s", topic)
                except Exception as exc:  # noqa: BLE001 - a rival relay may have created it
                    if "TOPIC_ALREADY_EXISTS" in str(exc):
                        continue
                    if "AUTHORIZATION_FAILED" in str(exc):
                        raise KafkaAccessError(
                            f"cannot create topic {topic}: the relay's Kafka principal may neither see (Describe) "
                            f"nor create it: {GRANT_HINT}") from None
                    raise TerminalError(f"cannot create topic {topic}: {exc}; create it or grant CreateTopics")
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in sorted(missing)]
        for resource, future in admin.describe_configs(resources).items():
            try:
                entry = future.result(30).get("max.message.bytes")
                topic_limit = int(entry.value) if entry is not None and entry.value else PRODUCER_MESSAGE_MAX
            except Exception:  # noqa: BLE001 - no DescribeConfigs right: the producer's limit still holds
                topic_limit = PRODUCER_MESSAGE_MAX
            producer_limit = int(self.client_config.get("message.max.bytes", PRODUCER_MESSAGE_MAX))
            self._limits[resource.name] = min(topic_limit, producer_limit)
        self._count_partitions(admin, missing)
        self._known_topics |= missing

    def _count_partitions(self, admin: Any, topics: set[str]) -> None:
        """Learn how many partitions each topic has (a topic just created may take a moment to show them)."""
        deadline = time.monotonic() + 30
        while True:
            listed = _admin_call(lambda: admin.list_topics(timeout=15)).topics
            counts = {t: len(listed[t].partitions) for t in topics
                      if t in listed and listed[t].error is None and listed[t].partitions}
            self._partition_counts.update(counts)
            if len(counts) == len(topics):
                self._counted_at = time.monotonic()
                return
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"no partitions listed for {sorted(set(topics) - set(counts))} "
                                            "30 s after creating them")
            time.sleep(0.2)

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

    # -- step 4: what goes where -------------------------------------------------------

    def _topic(self, aggregatetype: bytes) -> str:
        topic = self._routes.get(aggregatetype)
        if topic is None:
            topic = self._routes[aggregatetype] = self.config.topic_for(aggregatetype.decode())
        return topic

    def _routed(self, txn: SourceTransaction) -> list[str]:
        """The topic of each event of ``txn`` (routed once: step 4's checks and step 5's messages use them);
        a topic met for the first time is created if missing and its size limit learnt."""
        routes = self._routes
        topics = [routes.get(e.aggregatetype) or self._topic(e.aggregatetype) for e in txn.events]
        if not self._known_topics.issuperset(topics):
            self._ensure_topics(set(topics))
        return topics

    def _oversized(self, txn: SourceTransaction, topics: list[str]) -> tuple[bytes, str, int, int] | None:
        """The first event of ``txn`` larger than its topic takes: (event id, topic, size, limit), or None."""
        distinct = set(topics)
        header_bytes = 200 + 2 * len(str(txn.xid)) + 64 * len(distinct)  # the tidemark.* headers, generously
        if 0 < txn.size and txn.size + len(topics) * (header_bytes + RECORD_OVERHEAD) <= min(
                self._limits[t] for t in distinct):
            return None  # the whole transaction fits the smallest limit: no event can exceed it
        for e, topic in zip(txn.events, topics, strict=True):
            size = e.size + header_bytes + RECORD_OVERHEAD
            if size > self._limits[topic]:
                return e.id, topic, size, self._limits[topic]
        return None

    def _admit(self, txn: SourceTransaction, topics: list[str]) -> bool:
        """Whether ``txn`` (its events bound for ``topics``) goes to Kafka (True) or to the dead letters
        (False); raises if it may do neither."""
        big = self._oversized(txn, topics)
        if big is None:
            return True
        event, topic, size, limit = big
        ids = [e.id.decode() for e in txn.events]
        reason = (f"event {event.decode()} is about {size} bytes; {topic} takes at most {limit} "
                  "(the producer's message.max.bytes and the topic's max.message.bytes)")
        with self._connect_db().cursor() as cur:
            if acknowledged(cur, self.dead_letters, ids):
                log.warning("source transaction %d (commit LSN %s): acknowledged as dead letters (%s); skipping it",
                            txn.xid, format_lsn(txn.commit_lsn), reason)
                return False
            if self.config.on_oversized == "dead_letter":
                dead_letter_events(cur, self.table, self.dead_letters, ids, reason)
                log.error("ALERT relay %s: source transaction %d (commit LSN %s, %d events) moved to %s: %s",
                          self.config.id, txn.xid, format_lsn(txn.commit_lsn), len(ids), self.dead_letters, reason)
                return False
        raise OversizedEventError(
            f"source transaction {txn.xid} (commit LSN {format_lsn(txn.commit_lsn)}): {reason}. Nothing of it was "
            f"produced and the position stops before it. Either raise the limits and restart, or move the whole "
            f"transaction to {self.dead_letters} with `tidemark relay dead-letter --xid {txn.xid}` and restart "
            "(relay.on_oversized: dead_letter does that by itself)")

    def _messages(self, txn: SourceTransaction, topics: list[str]
                  ) -> Iterator[tuple[str, bytes, bytes | None, list[Any]]]:
        """(topic, key, value, headers) of each event (bound for ``topics``, :meth:`_routed`), built as it is
        produced: the transaction is held once."""
        counts = tuple(sorted(Counter(topics).items()))
        counted = self._counts_json.get(counts)
        if counted is None:  # a handful of distinct shapes per deployment: each one serialised once
            counted = json.dumps(dict(counts), separators=(",", ":")).encode()
            if len(self._counts_json) < 4096:
                self._counts_json[counts] = counted
        shared = [(H.TXID, str(txn.xid).encode()), (H.LSN, format_lsn(txn.commit_lsn).encode()),
                  (H.SIZE, str(len(txn.events)).encode()), (H.TOPIC_COUNTS, counted),
                  (H.SOURCE, H.source(self.config.id, txn.commit_lsn).encode())]
        for i, (topic, e) in enumerate(zip(topics, txn.events, strict=True)):
            yield topic, e.aggregateid, e.payload, [(H.EVENT_ID, e.id), (H.EVENT_TYPE, e.type), *shared,
                                                    (H.POSITION, str(i).encode())]

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
        if time.monotonic() - self._counted_at > PARTITIONS_REFRESH_SECONDS:
            from confluent_kafka.admin import AdminClient

            self._count_partitions(AdminClient(self.client_config), set(self._partition_counts))
        producer.begin()
        group.placement, group.open = Placement(frozenset(self._exact_topics)), True

    def _stage(self, producer: TransactionalProducer, group: Group, txn: SourceTransaction, topics: list[str]) -> None:
        """Step 5's events, as ``txn`` (the group's newest) joins it: librdkafka sends them while the next
        transactions are decoded. Each partition's newest event waits in ``group.held`` (see there)."""
        if group.placement is None:
            self._open(producer, group)
            if not group.txns or group.txns[-1] is not txn:
                return  # relayed by another instance meanwhile
        placement, held, offsets, unsent = group.placement, group.held, group.offsets, group.unsent
        assert placement is not None
        counts, exact, delivered = self._partition_counts, placement.exact, group.delivered
        spans = placement.open()
        for topic, key, value, headers in self._messages(txn, topics):
            partition = partition_for(key, counts[topic])
            tp = (topic, partition)
            n = placement.place(spans, tp)
            if n:  # the partition's previous newest goes now; its report, if any, was chosen when staged
                unsent.append(held[tp])
                report = partial(delivered, tp, n) if topic in exact else None
            else:  # the partition's first event in the group: the manifest needs its offset
                offsets[tp] = {}
                report = partial(delivered, tp, 0)
            held[tp] = (topic, partition, key, value, headers, report)
        if len(unsent) >= SEND_BATCH:
            producer.within(lambda p: self._send(p, group), what=f"relaying source transaction {txn.xid}")

    @staticmethod
    def _send(p: TransactionalProducer, group: Group) -> None:
        """Hand ``group.unsent`` to librdkafka, asking for the delivery reports the manifest needs:
        a partition's first event, and every event of an :attr:`Placement.exact` topic."""
        p.produce_all(group.unsent)
        group.unsent.clear()
        p.serve()  # the reports that came in meanwhile: the close finds the first offsets known

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
            self._send(p, group)
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
        """Relay until ``stop`` is set (or, with ``idle_exit``, until nothing arrives for that long)."""
        with collector_for_groups():
            return self._run(stop, idle_exit)

    def _run(self, stop: threading.Event, idle_exit: float | None) -> RelayReport:
        delay, redos, committed, relayed = 1.0, 0, -1, 0
        while not stop.is_set():
            try:
                self._session(stop, idle_exit)
                return self.report
            except (KafkaUnavailableError, PositionUnreadableError, ServiceUnavailableError) as outage:
                if self.report.kafka_transactions != relayed:  # a new outage, not the same one going on
                    delay, relayed = 1.0, self.report.kafka_transactions
                self.report.outages += 1
                log.warning("Kafka unavailable (%s); the relay steps back for %.0f s and resumes by itself "
                            "(the slot keeps every transaction not yet acknowledged)", outage, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)
            except (TransactionAbortedError, CommitOutcomeUnknownError) as error:
                redos = 1 if self.report.kafka_transactions != committed else redos + 1
                committed = self.report.kafka_transactions
                if redos > MAX_REDOS:
                    raise ProducerFatalError(f"the same group failed {redos} times in a row, last: {error}; "
                                             "check the broker logs, topic ACLs and limits") from error
                self.report.redone += 1
                log.warning("%s; fencing again and reading the position back before relaying anything more", error)
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
            self._ensure_topics({self.config.offsets_topic}, compacted=True)
            self._ensure_topics({self.config.manifest_topic}, single=True)
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
                    if group.txns and (group.events + len(txn.events) > limits.max_events
                                       or group.size + txn.size > limits.max_bytes
                                       or len(group.txns) >= limits.max_transactions):
                        self._flush(producer, group, capture)
                        group = Group()
                    try:
                        topics = self._routed(txn)                             # step 4
                        admitted = self._admit(txn, topics) if topics else True
                    except OversizedEventError:
                        if group.txns:
                            self._flush(producer, group, capture)
                        self._acknowledge(capture)
                        raise
                    group.add(txn, dead=not admitted)
                    if admitted and txn.events:
                        self._stage(producer, group, txn, topics)              # step 5, as it joins
                    if (time.monotonic() - group.opened >= linger or group.events >= limits.max_events
                            or group.size >= limits.max_bytes or len(group.txns) >= limits.max_transactions):
                        self._flush(producer, group, capture)
                        group = Group()
                except (psycopg2.OperationalError, psycopg2.InterfaceError, ReplicationLostError) as exc:
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
                    capture, group = None, Group()
                    self._db = None
                    self._pending_ids, self._pending_lsn, self._unacked = [], None, 0
                    stop.wait(1.0)
                    # Still ours? A newer relay may have fenced us and ended our session.
                    self._probe_ownership(producer)
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
        self._offsets_partition = offsets_partition(self.config.id, self._partitions(self.config.offsets_topic) or 1)
        log.info("relay %s resumes after %s", self.config.id,
                 format_lsn(self.position.end_lsn) if self.position else "the start")

    def _partitions(self, topic: str) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.client_config)
        metadata = _admin_call(lambda: admin.list_topics(topic, timeout=15)).topics.get(topic)
        return len(metadata.partitions) if metadata is not None and metadata.error is None else 0

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


def relay_status(relay: RelayConfig, *, dsn: str, client_config: dict[str, Any]) -> dict[str, str]:
    """Position, slot state and lag (events not yet relayed, age of the oldest); Kafka being down is a state."""
    import psycopg2

    table = TableName.parse(relay.table)
    try:
        position = read_position(client_config, relay.offsets_topic, relay.id, wait=5)
        status = {"relay": relay.id, "position": format_lsn(position.end_lsn) if position else "(none yet)",
                  "last relayed at": position.relayed_at if position else "-"}
    except (ServiceUnavailableError, PositionUnreadableError) as exc:
        status = {"relay": relay.id, "position": f"(Kafka unavailable: {exc})", "last relayed at": "?"}
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_jsonb(s), pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)) "
                        "FROM pg_replication_slots s WHERE slot_name = %s", (relay.slot_name,))
            row = cur.fetchone()
            if row is None:
                raise ConfigError(f"replication slot {relay.slot_name!r} does not exist: run `tidemark outbox init`")
            slot, retained = row[0], row[1]
            active = f"active, pid {slot['active_pid']}" if slot.get("active") else "inactive"
            invalid = slot.get("invalidation_reason") or ("WAL lost" if slot.get("wal_status") == "lost" else None)
            status["slot"] = f"{relay.slot_name} ({active}{', INVALIDATED: ' + invalid if invalid else ''})"
            status["slot confirmed"] = str(slot.get("confirmed_flush_lsn"))
            status["WAL retained"] = str(retained)
            pending, age = _backlog(cur, table)
            status["lag (events)"] = str(pending)
            status["lag (seconds)"] = f"{age:.1f}"
    finally:
        conn.close()
    return status


def _backlog(cur: Any, table: TableName) -> tuple[int, float]:
    cur.execute(f"SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at)) FROM {table.sql}")
    pending, age = cur.fetchone()
    return int(pending), max(0.0, float(age)) if age is not None else 0.0


def relay_backlog(relay: RelayConfig, dsn: str) -> tuple[int, float]:
    """(outbox rows not yet relayed and acknowledged, age in seconds of the oldest; 0 when none)."""
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            return _backlog(cur, TableName.parse(relay.table))
    finally:
        conn.close()
