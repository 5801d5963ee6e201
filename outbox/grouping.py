"""Grouping: consecutive source transactions into one Kafka transaction, and their events into it.

Why this is its own module: one Kafka commit per source transaction caps the relay near
1,000 transactions/s, so the relay commits groups (steps 4 and 5 of ``outbox.relay``). What a
group holds, when it is full, which partition each event goes to, how its events are built
and handed to librdkafka as each source transaction joins, and how the cyclic collector is
kept off the objects a group holds until its commit, are one concern: the shape of a Kafka
transaction. When the group opens and closes, and what a crash leaves, stay in the protocol
(``outbox.relay``).
"""

from __future__ import annotations

import gc
import json
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import KafkaError

from connectors.producer import TransactionalProducer
from outbox import wire
from outbox.capture import SourceTransaction
from outbox.manifest import Placement
from outbox.wire import TopicPartition
from tidemark.config import GroupCommitConfig

#: Staged events handed to librdkafka at a time: one call per batch, not per source transaction.
SEND_BATCH = 512

#: The collector's young-generation threshold while the relay runs (Python's default is 700).
#: A group holds its source transactions' events until its commit, some 20,000 tracked objects
#: at the default limits; with the default threshold the collector walked them again at every
#: young collection and promoted them to be walked again, 0.26-0.30 s of CPU per 200,000
#: events (5 %, timed with ``gc.callbacks`` around ``bench.relay_bench``). Reference counting frees
#: a group at its commit (:meth:`Group.release` breaks its one cycle); the collector only has the
#: rare cycles left to find.
YOUNG_GC_THRESHOLD = 50_000


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
    group cannot commit its manifest (see :meth:`outbox.relay.Relay._await_deliveries`)."""
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

    def overflows(self, txn: SourceTransaction, limits: GroupCommitConfig) -> bool:
        """Whether ``txn`` would take the group past a limit: the group closes first (never split,
        so a source transaction larger than the limits goes alone)."""
        return bool(self.txns) and (self.events + len(txn.events) > limits.max_events
                                    or self.size + txn.size > limits.max_bytes
                                    or len(self.txns) >= limits.max_transactions)

    def full(self, linger: float, limits: GroupCommitConfig) -> bool:
        """Whether the group has lingered ``linger`` seconds or reached a limit: it closes now."""
        return (time.monotonic() - self.opened >= linger or self.events >= limits.max_events
                or self.size >= limits.max_bytes or len(self.txns) >= limits.max_transactions)


class Staging:
    """Step 5's events of each source transaction as it joins its group (owned by
    :class:`outbox.relay.Relay`, which opens the group's Kafka transaction first)."""

    def __init__(self, relay_id: str, partition_counts: dict[str, int]) -> None:
        self.relay_id = relay_id
        self.partition_counts = partition_counts
        """Each topic's partition count, kept current by :class:`outbox.admission.Admission`."""
        self._counts_json: dict[tuple[tuple[str, int], ...], bytes] = {}

    def messages(self, txn: SourceTransaction, topics: list[str]
                  ) -> Iterator[tuple[str, bytes, bytes | None, list[Any]]]:
        """(topic, key, value, headers) of each event (bound for ``topics``, :meth:`_routed`), built as it is
        produced: the transaction is held once."""
        counts = tuple(sorted(Counter(topics).items()))
        counted = self._counts_json.get(counts)
        if counted is None:  # a handful of distinct shapes per deployment: each one serialised once
            counted = json.dumps(dict(counts), separators=(",", ":")).encode()
            if len(self._counts_json) < 4096:
                self._counts_json[counts] = counted
        shared = wire.txn_headers(self.relay_id, txn.xid, txn.commit_lsn, len(txn.events), counted)
        values = txn.values or [e.payload for e in txn.events]
        for i, (topic, e, value) in enumerate(zip(topics, txn.events, values, strict=True)):
            yield topic, e.aggregateid, value, [(wire.EVENT_ID, e.id), (wire.EVENT_TYPE, e.type), *shared,
                                                    (wire.POSITION, str(i).encode())]

    def stage(self, producer: TransactionalProducer, group: Group, txn: SourceTransaction, topics: list[str]) -> None:
        """Step 5's events, as ``txn`` (the group's newest) joins its open Kafka transaction: librdkafka
        sends them while the next transactions are decoded. Each partition's newest event waits in
        ``group.held`` (see there)."""
        placement, held, offsets, unsent = group.placement, group.held, group.offsets, group.unsent
        assert placement is not None
        counts, exact, delivered = self.partition_counts, placement.exact, group.delivered
        spans = placement.open()
        for topic, key, value, headers in self.messages(txn, topics):
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
            producer.within(lambda p: self.send(p, group), what=f"relaying source transaction {txn.xid}")

    @staticmethod
    def send(p: TransactionalProducer, group: Group) -> None:
        """Hand ``group.unsent`` to librdkafka, asking for the delivery reports the manifest needs:
        a partition's first event, and every event of an :attr:`Placement.exact` topic."""
        p.produce_all(group.unsent)
        group.unsent.clear()
        p.serve()  # the reports that came in meanwhile: the close finds the first offsets known
