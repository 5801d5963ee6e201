"""The relay's position: how far into which database's change stream it has relayed.

A position is the end LSN of the last source transaction relayed, plus the stream it
belongs to (:class:`Source`: the PostgreSQL system identifier, timeline and slot), so a
restored or replaced database, a failover past the relayed point, or a recreated slot is
noticed instead of silently skipping or deleting rows (:mod:`outbox.source`). It lives in
a compacted offsets topic, key = relay id, written in the same Kafka transaction as the
events it covers (Kafka Connect KIP-618 style).

Reading it back must see this relay's newest committed record. Under read_committed a
reader stops at the partition's LSO, and another producer's open transaction (a second
relay id sharing the topic, crashed or mid-commit) holds the LSO below our newest record:
reading to partition EOF would return an older position, and the relay would send its
events again. So :func:`read_position` first takes the high watermark (read_uncommitted),
then reads committed records until it has passed it, waiting for the transactions open
below it to end (a crashed producer's within its transaction timeout). It reads the tail
first — the last few thousand offsets, further back only while this relay's key is not
found — so start-up does not grow with the topic's history.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connectors.preflight import group_refused
from outbox.pgoutput import format_lsn
from tidemark.errors import ServiceUnavailableError, TransientError

#: Offsets read from the end first; each further step back reads 8 times as many.
TAIL = 2048

#: Settings of an offsets topic the relay creates: compacted, with segments that roll
#: often enough for the cleaner to keep it at about one record per relay id.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(8 * 1024 * 1024),
                        "segment.ms": str(3_600_000), "min.cleanable.dirty.ratio": "0.1",
                        "delete.retention.ms": str(86_400_000)}


class PositionUnreadableError(TransientError):
    """A transaction open below the offsets topic's high watermark hides this relay's newest position."""


@dataclass(frozen=True)
class Source:
    """The change stream a position counts in."""

    system_id: str
    """PostgreSQL's system identifier (``IDENTIFY_SYSTEM``): a new one means another database cluster."""
    timeline: int
    """The server's timeline when the position was written; a restore or failover starts a new one."""
    slot: str


@dataclass(frozen=True)
class Position:
    end_lsn: int
    xid: int
    relayed_at: str
    source: Source | None = None
    """None for a position written before Tidemark recorded its stream."""

    def to_json(self, relay_id: str) -> bytes:
        data: dict[str, Any] = {"relay": relay_id, "end_lsn": self.end_lsn, "end_lsn_text": format_lsn(self.end_lsn),
                                "xid": self.xid, "relayed_at": self.relayed_at}
        if self.source is not None:
            data |= {"system_id": self.source.system_id, "timeline": self.source.timeline, "slot": self.source.slot}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Position:
        data = json.loads(raw)
        source = None
        if "system_id" in data:
            source = Source(str(data["system_id"]), int(data["timeline"]), str(data["slot"]))
        return cls(int(data["end_lsn"]), int(data["xid"]), str(data["relayed_at"]), source)


def resumed(known: Position | None, read: Position | None, topic: str) -> Position | None:
    """The position to resume from: ``read``, unless it is older than ``known``, the newest one this
    process committed or read before in the same stream. Acting on an older one would relay again
    what the slot resends and Kafka already holds, so it is an unsettled read (a broker just
    restarted or paused) or a topic that is not the one it was (a replaced cluster), transient
    either way. A position from another stream is returned: :func:`outbox.source.verify` judges it."""
    if known is not None and (read is None or (read.source == known.source and read.end_lsn < known.end_lsn)):
        raise PositionUnreadableError(
            f"offsets topic {topic} answered position {format_lsn(read.end_lsn) if read else '(none)'}, older "
            f"than {format_lsn(known.end_lsn)}, which this relay committed or read before: the topic is not "
            "settled (a broker restarting or paused) or is not the one it was (a replaced cluster); the "
            "relay reads it again before it relays anything")
    return read


def offsets_partition(relay_id: str, partitions: int) -> int:
    """The partition of the offsets topic that holds ``relay_id``'s positions (stable, not the client's partitioner)."""
    return zlib.crc32(relay_id.encode()) % partitions if partitions > 1 else 0


def read_position(client_config: Mapping[str, Any], topic: str, relay_id: str, *,
                  wait: float = 150.0, exists: bool = False) -> Position | None:
    """The newest committed position of ``relay_id``, or None if it has none.

    ``wait``: how long a transaction open below the high watermark may hide the newest
    record before :class:`PositionUnreadableError`. ``exists``: the caller knows the topic
    exists (the relay made or found it). None means "relay from the slot's start", so it is
    answered only when the topic's history is read and holds no record of ``relay_id``: a
    metadata answer without the topic (when it ``exists``), without partitions or without a
    leader is a broker settling after a restart or a pause, and raises
    :class:`ServiceUnavailableError` (transient) instead.
    """
    base = {k: v for k, v in client_config.items() if k not in {"transactional.id", "isolation.level"}}
    base |= {"group.id": f"tidemark-position-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
             "enable.partition.eof": True, "auto.offset.reset": "earliest"}
    probe = Consumer({**base, "isolation.level": "read_uncommitted"})
    try:
        metadata = probe.list_topics(topic, timeout=15).topics.get(topic)
        error = None if metadata is None else metadata.error
        if metadata is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            if not exists:
                return None
            raise ServiceUnavailableError(f"offsets topic {topic} is missing from the cluster's metadata")
        if error is not None or not metadata.partitions:
            raise ServiceUnavailableError(f"offsets topic {topic}: metadata {error or 'without partitions'}")
        partition = offsets_partition(relay_id, len(metadata.partitions))
        leader = metadata.partitions.get(partition)
        if leader is None or leader.error is not None or leader.leader < 0:
            raise ServiceUnavailableError(f"offsets topic {topic}[{partition}] has no leader "
                                          f"({leader.error if leader is not None else 'not listed'})")
        low, high = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=15, cached=False)
    except KafkaException as exc:
        raise ServiceUnavailableError(f"offsets topic {topic}: {exc.args[0]}") from None
    finally:
        probe.close()
    reader = Consumer({**base, "isolation.level": "read_committed"})
    try:
        key, end, span = relay_id.encode(), int(high), TAIL
        deadline = time.monotonic() + wait
        while end > low:
            start = max(int(low), end - span)
            found = _newest(reader, topic, partition, start, end, key, deadline, client_config)
            if found is not None:
                return Position.from_json(found)
            end, span = start, span * 8
        return None
    finally:
        reader.close()


def _newest(reader: Consumer, topic: str, partition: int, start: int, end: int, key: bytes,
            deadline: float, config: Mapping[str, Any]) -> bytes | None:
    """The value of the last committed record with ``key`` in ``[start, end)``, waiting for open transactions below ``end``."""
    tp = TopicPartition(topic, partition, start)
    reader.assign([tp])
    newest: bytes | None = None
    while True:
        for m in reader.consume(num_messages=10_000, timeout=0.2):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                refused = group_refused(err, config)
                if refused is not None:
                    raise refused
                raise ServiceUnavailableError(f"reading offsets topic {topic}[{partition}]: {err.str()}")
            if (m.offset() or 0) < end and m.key() == key and m.value():
                newest = m.value()
        position = reader.position([TopicPartition(topic, partition)])[0].offset
        if position >= end:
            return newest
        if time.monotonic() > deadline:
            raise PositionUnreadableError(
                f"offsets topic {topic}[{partition}]: a transaction open below offset {end} (another producer: a "
                f"relay with another id, crashed or committing) hides this relay's newest position; read_committed "
                f"reached only offset {position}. It ends when that producer commits, aborts or times out "
                "(transaction.timeout.ms); the relay retries")
