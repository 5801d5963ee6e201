"""Records of exact offset ranges, read on the driver by one librdkafka consumer.

For what the planner needs before a batch is read by Spark: the G3 scan (position,
timestamp and headers of every record of the proposed ranges, :func:`headed_records`)
and the byte cap's sample (``connectors.sizes``). Spark's Kafka source cannot leave the
values out: it copies each into a row, so a scan through it costs about as much as the
batch's write (3x what this reader costs on 1 KB records, measured on 2 cores).
librdkafka hands out a record without converting it.

Semantics are those of ``pipelines.transform.read_ranges``: ``read_committed``, exactly
``[start, end)`` of each range, a start deleted by retention is an error (never a skip).
A range is done at its last offset, at a record past it, at partition EOF past it, or
when the consumer's position has moved past it over markers and aborted records, so such
ranges cost one fetch round trip, not a timeout. A caller may also finish a partition
early (:meth:`RangeReader.finish`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.admin import TP
from tidemark.errors import ServiceUnavailableError, TerminalError

Headers = list[tuple[str, bytes | None]]


class RangeGoneError(TerminalError):
    """Records of a range were deleted (retention) between planning and reading."""


class RangeReader:
    """One read of ``ranges`` (``(topic, partition, start, end)``, at most one per partition)."""

    def __init__(self, client_config: Mapping[str, str], ranges: Iterable[tuple[str, int, int, int]], *,
                 fetch_bytes: int = 64 * 1024 * 1024, partition_fetch_bytes: int = 16 * 1024 * 1024,
                 stall_timeout: float = 120.0, isolation: str = "read_committed") -> None:
        self.todo: dict[TP, tuple[int, int]] = {(t, p): (start, end) for t, p, start, end in ranges if end > start}
        self.pending = set(self.todo)
        self.stall_timeout = stall_timeout
        self._consumer = Consumer({
            **client_config,
            "group.id": f"tidemark-ranges-{uuid.uuid4().hex[:12]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.max.bytes": fetch_bytes,
            "max.partition.fetch.bytes": partition_fetch_bytes,
            "queued.max.messages.kbytes": max(4 * fetch_bytes // 1024, 16 * 1024),
        })

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    def finish(self, tp: TP) -> None:
        """Read no more of ``tp``'s range."""
        self.pending.discard(tp)
        self._consumer.pause([TopicPartition(tp[0], tp[1])])

    def records(self) -> Iterator[Any]:
        """Every record (a confluent-kafka ``Message``) of the ranges not yet finished, in offset order per partition."""
        todo, pending, consumer = self.todo, self.pending, self._consumer
        if not pending:
            return
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in todo.items()])
        progress = time.monotonic()
        while pending:
            # Up to 10,000 records per call; messages of one partition come in runs, so the
            # per-partition look-ups happen once per run, not per record (the hot loop).
            messages: list[Any] = consumer.consume(num_messages=10_000, timeout=0.05)
            current: TP | None = None
            live, end = False, 0
            for m in messages:
                err = m.error()
                if err is not None:
                    tp = (str(m.topic()), int(m.partition() or 0))
                    current = None  # re-read the partition's state after an event
                    if tp not in pending:
                        continue
                    if err.code() == KafkaError._PARTITION_EOF:
                        if int(m.offset() or 0) >= todo[tp][1]:
                            self.finish(tp)
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise RangeGoneError(
                            f"{tp[0]}[{tp[1]}]: offset {todo[tp][0]} was deleted by Kafka retention while the "
                            "batch was planned; nothing was skipped. Run the ingest again: it reports the loss")
                    raise ServiceUnavailableError(f"reading {tp[0]}[{tp[1]}]: {err.str()}")
                topic, partition = m.topic(), m.partition()
                if current is None or partition != current[1] or topic != current[0]:
                    current = (topic, partition)
                    live = current in pending
                    end = todo[current][1] if live else 0
                if not live:
                    continue
                offset = m.offset()
                if offset >= end:
                    self.finish(current)
                    live = False
                    continue
                yield m
                live = current in pending  # the caller may have finished it
                if live and offset + 1 >= end:
                    self.finish(current)
                    live = False
            if messages:
                progress = time.monotonic()
            elif pending:
                # Markers and aborted records move the position without delivering anything.
                for p in consumer.position([TopicPartition(t, n) for t, n in pending]):
                    if p.offset >= todo[(p.topic, p.partition)][1]:
                        self.finish((p.topic, p.partition))
                        progress = time.monotonic()
                if pending and time.monotonic() - progress > self.stall_timeout:
                    raise ServiceUnavailableError(
                        f"reading {sorted(pending)[:3]}: no progress for {self.stall_timeout:.0f}s; "
                        "is the broker up?")


def headed_records(client_config: Mapping[str, str], ranges: Iterable[tuple[str, int, int, int]],
                   *, small: bool = False) -> Iterator[tuple[str, int, int, int, Headers]]:
    """``(topic, partition, offset, timestamp ms, headers)`` of every record with headers in ``ranges``.

    ``small``: the ranges are a few records each, so fetch kilobytes, not megabytes.
    """
    fetch, partition_fetch = (4 * 1024 * 1024, 256 * 1024) if small else (64 * 1024 * 1024, 16 * 1024 * 1024)
    with RangeReader(client_config, ranges, fetch_bytes=fetch, partition_fetch_bytes=partition_fetch) as reader:
        for m in reader.records():
            headers = m.headers()
            if headers:
                yield m.topic(), m.partition(), m.offset(), m.timestamp()[1], headers
