"""What the broker says about partitions: which exist, where they start, where they end.

Under read_committed the end of a partition is its **last stable offset** (LSO), not its
high watermark: ``ListOffsets`` for the latest offset at ``READ_COMMITTED`` returns it. A
start offset below a partition's log-start offset means records were deleted by retention
before we read them; that is data loss and is raised as :class:`RetentionLossError`,
never skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NewType, Self

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tidemark.errors import ServiceUnavailableError, TerminalError

Topic = NewType("Topic", str)
PartitionId = NewType("PartitionId", int)
Offset = NewType("Offset", int)
TP = tuple[str, int]


class RetentionLossError(TerminalError):
    """Records we must read were deleted by Kafka retention before we read them."""

    DEFAULT_HINT = ("To accept the loss and go on under this pipeline: `tidemark offsets seek PIPELINE "
                    "--to earliest --skip`, which records the lost ranges (docs/runbooks.md, 'Retention loss')")

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
    """Metadata and offset look-ups, by an AdminClient.

    Every partition's end is asked for in one ``ListOffsets`` request per leader, not one
    partition after another: a batch's ends are a snapshot of one instant. Taken partition by
    partition (tens of milliseconds apart), a relay's Kafka transaction that committed in
    between showed in some partitions and not in others, and its source transactions,
    split by the snapshot, waited a whole batch for the next (G3).

    ``isolation="read_uncommitted"`` makes :meth:`bounds` give the high watermark instead of
    the LSO: where open transactions' records end.
    """

    def __init__(self, client_config: Mapping[str, str], *, timeout: float = 15.0,
                 isolation: str = "read_committed") -> None:
        levels = {"read_committed": IsolationLevel.READ_COMMITTED, "read_uncommitted": IsolationLevel.READ_UNCOMMITTED}
        if isolation not in levels:
            raise ValueError(f"isolation must be one of {sorted(levels)}, not {isolation!r}")
        self.timeout = timeout
        self._isolation = levels[isolation]
        self._admin = AdminClient(dict(client_config))

    def close(self) -> None:
        self._admin.poll(0)  # serves the client's log lines (a `logger` in its config) before it goes

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _metadata(self) -> Any:
        try:
            return self._admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"Kafka metadata request failed: {exc}") from exc

    @staticmethod
    def _matching(metadata: Any, topics: Iterable[str], pattern: str | None) -> list[str]:
        existing = {name for name in metadata.topics if not name.startswith("__")}
        if pattern is not None:
            regex = re.compile(pattern)
            return sorted(t for t in existing if regex.fullmatch(t))
        wanted = list(topics)
        missing = [t for t in wanted if t not in existing]
        if missing:
            raise TerminalError(f"source topic(s) do not exist: {', '.join(missing)}; create them or fix `topics`")
        return sorted(wanted)

    @staticmethod
    def _partitions_of(metadata: Any, topic: str) -> list[TP]:
        md = metadata.topics[topic]
        if md.error is not None:
            raise ServiceUnavailableError(f"Kafka metadata for {topic}: {md.error}")
        return [(topic, p) for p in sorted(md.partitions)]

    def topics_matching(self, topics: Iterable[str] = (), pattern: str | None = None) -> list[str]:
        return self._matching(self._metadata(), topics, pattern)

    def partitions_matching(self, topics: Iterable[str] = (), pattern: str | None = None) -> list[TP]:
        """Every partition of :meth:`topics_matching`, from the same metadata request."""
        metadata = self._metadata()
        return [tp for topic in self._matching(metadata, topics, pattern) for tp in self._partitions_of(metadata, topic)]

    def _offsets(self, partitions: list[TP], spec: Any) -> Mapping[TP, Any]:
        """Futures of ``spec``'s offset per partition: one request per leader, sent now."""
        futures = self._admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions},
                                           isolation_level=self._isolation, request_timeout=self.timeout)
        return {(tp.topic, tp.partition): future for tp, future in futures.items()}

    @staticmethod
    def _offset(futures: Mapping[TP, Any], tp: TP) -> int:
        try:
            return int(futures[tp].result().offset)
        except KafkaException as exc:
            raise ServiceUnavailableError(f"offsets of {tp[0]}[{tp[1]}] unavailable: {exc}") from exc

    @classmethod
    def _bound(cls, futures: Mapping[TP, Any], tp: TP, which: str) -> int:
        """A partition's log start or LSO; a negative answer (librdkafka's ``OFFSET_INVALID``, -1001)
        is a leader that cannot say yet, as during an election: an outage to wait out, never an
        offset (a stored end past -1001 would read as a recreated topic)."""
        offset = cls._offset(futures, tp)
        if offset < 0:
            raise ServiceUnavailableError(f"offsets of {tp[0]}[{tp[1]}] unavailable: its leader answered {offset} "
                                          f"for its {which} (a leader election in progress?)")
        return offset

    def bounds(self, partitions: Iterable[TP]) -> dict[TP, PartitionBounds]:
        """Log-start offset and LSO of each partition, fresh from the leaders; the LSOs of one instant."""
        parts = list(dict.fromkeys(partitions))
        if not parts:
            return {}
        ends = self._offsets(parts, OffsetSpec.latest())
        starts = self._offsets(parts, OffsetSpec.earliest())
        return {tp: PartitionBounds(self._bound(starts, tp, "log start"), self._bound(ends, tp, "LSO"))
                for tp in parts}

    def offsets_for_time(self, partitions: Iterable[TP], when: datetime) -> dict[TP, int]:
        """First offset at or after ``when`` per partition; the LSO where nothing is that late."""
        parts = list(dict.fromkeys(partitions))
        found = self._offsets(parts, OffsetSpec.for_timestamp(int(when.timestamp() * 1000)))
        bounds = self.bounds(parts)
        offsets = {tp: self._offset(found, tp) for tp in parts}
        return {tp: offset if offset >= 0 else bounds[tp].stable_end for tp, offset in offsets.items()}


def check_retention(starts: Mapping[TP, int], bounds: Mapping[TP, PartitionBounds]) -> None:
    """Raise :class:`RetentionLossError` if any start offset has already been deleted."""
    losses = {tp: (start, bounds[tp].log_start) for tp, start in starts.items() if start < bounds[tp].log_start}
    if losses:
        raise RetentionLossError(losses)
