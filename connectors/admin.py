"""What the broker says about partitions: which exist, where they start, where they end.

Under read_committed the end of a partition is its **last stable offset** (LSO), not its
high watermark: ``get_watermark_offsets(cached=False)`` on a read_committed consumer asks
the broker and returns the LSO. A start offset below a partition's log-start offset
means records were deleted by retention before we read them; that is data loss and is
raised as :class:`RetentionLossError`, never skipped.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NewType, Self

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tidemark.errors import ServiceUnavailableError, TerminalError

Topic = NewType("Topic", str)
PartitionId = NewType("PartitionId", int)
Offset = NewType("Offset", int)
TP = tuple[str, int]


class RetentionLossError(TerminalError):
    """Records we must read were deleted by Kafka retention before we read them."""

    DEFAULT_HINT = ("To accept the loss, ingest under a new pipeline name with `start: earliest` "
                    "(docs/operations.md, 'Retention loss')")

    def __init__(self, losses: Mapping[TP, tuple[int, int]], *, context: str = "", hint: str = DEFAULT_HINT) -> None:
        self.losses = dict(losses)
        detail = ", ".join(f"{t}[{p}] wanted {want} but the log starts at {first}"
                           for (t, p), (want, first) in sorted(self.losses.items()))
        super().__init__(f"data lost to Kafka retention{context}: {detail}. Nothing was skipped. {hint}")


@dataclass(frozen=True)
class PartitionBounds:
    log_start: int
    stable_end: int  # the LSO: first offset not yet visible to read_committed readers


class KafkaAdmin:
    """A read_committed consumer used only for metadata and offset look-ups.

    ``isolation="read_uncommitted"`` makes :meth:`bounds` give the high watermark instead of
    the LSO: where open transactions' records end.
    """

    def __init__(self, client_config: Mapping[str, str], *, timeout: float = 15.0,
                 isolation: str = "read_committed") -> None:
        self.timeout = timeout
        self._consumer = Consumer({
            **client_config,
            "group.id": f"tidemark-admin-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        })

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def topics_matching(self, topics: Iterable[str] = (), pattern: str | None = None) -> list[str]:
        try:
            metadata = self._consumer.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"Kafka metadata request failed: {exc}") from exc
        existing = {name for name in metadata.topics if not name.startswith("__")}
        if pattern is not None:
            regex = re.compile(pattern)
            return sorted(t for t in existing if regex.fullmatch(t))
        wanted = list(topics)
        missing = [t for t in wanted if t not in existing]
        if missing:
            raise TerminalError(f"source topic(s) do not exist: {', '.join(missing)}; create them or fix `topics`")
        return sorted(wanted)

    def partitions(self, topics: Iterable[str]) -> list[TP]:
        out: list[TP] = []
        for topic in topics:
            try:
                md = self._consumer.list_topics(topic, timeout=self.timeout).topics[topic]
            except KafkaException as exc:
                raise ServiceUnavailableError(f"Kafka metadata for {topic} failed: {exc}") from exc
            if md.error is not None:
                raise ServiceUnavailableError(f"Kafka metadata for {topic}: {md.error}")
            out += [(topic, p) for p in sorted(md.partitions)]
        return out

    def bounds(self, partitions: Iterable[TP]) -> dict[TP, PartitionBounds]:
        """Log-start offset and LSO of each partition, fresh from the leaders."""
        out: dict[TP, PartitionBounds] = {}
        for topic, partition in partitions:
            try:
                low, lso = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self.timeout, cached=False)
            except KafkaException as exc:
                raise ServiceUnavailableError(f"offsets of {topic}[{partition}] unavailable: {exc}") from exc
            out[(topic, partition)] = PartitionBounds(int(low), int(lso))
        return out

    def offsets_for_time(self, partitions: Iterable[TP], when: datetime) -> dict[TP, int]:
        """First offset at or after ``when`` per partition; the LSO where nothing is that late."""
        parts = list(partitions)
        millis = int(when.timestamp() * 1000)
        query = [TopicPartition(t, p, millis) for t, p in parts]
        try:
            found = self._consumer.offsets_for_times(query, timeout=self.timeout)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"offsets_for_times failed: {exc}") from exc
        bounds = self.bounds(parts)
        return {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else bounds[(tp.topic, tp.partition)].stable_end)
            for tp in found
        }


def check_retention(starts: Mapping[TP, int], bounds: Mapping[TP, PartitionBounds]) -> None:
    """Raise :class:`RetentionLossError` if any start offset has already been deleted."""
    losses = {tp: (start, bounds[tp].log_start) for tp, start in starts.items() if start < bounds[tp].log_start}
    if losses:
        raise RetentionLossError(losses)
