"""The transaction manifest's spans, placed as the relay produces (its record's layout and
codec: :mod:`outbox.wire`).

Why :class:`Placement` and not a delivery report per event: a report costs a Python call
and a message object per event, the largest cost the relay had over a plain producer.
The relay picks each event's partition itself, so it knows each event's index among the
events the Kafka transaction puts in that partition, and asks for the reports of the
first and the last there only (and of every event in the :attr:`Placement.exact` topics).
One producer's records in one partition keep their order
(idempotence), so when the last offset is the first plus the count less one, no other
record lies between them and every event's offset is the first plus its index. When
another producer's record does lie between them, the offsets in between are unknown:
the transaction is redone (:class:`InterleavedError`) with a report per event for that topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from connectors.producer import TransactionAbortedError
from outbox.wire import Span, TopicPartition, assemble, entry_json, json_text


class InterleavedError(TransactionAbortedError):
    """Another producer's record landed between two of ours in a partition: the spans are unknown there."""

    def __init__(self, partitions: list[TopicPartition]) -> None:
        self.topics = {t for t, _ in partitions}
        super().__init__(f"records of another producer landed between this transaction's in {sorted(partitions)[:3]}; "
                         "the transaction is redone with a delivery report per event for those topics")


@dataclass
class Placement:
    """The events of one Kafka transaction by index in their partition, and the spans they make (see above)."""

    exact: frozenset[str] = frozenset()
    """Topics whose every event gets a delivery report (another producer writes there too)."""
    sent: dict[TopicPartition, int] = field(default_factory=dict)
    """How many events the transaction puts in each partition."""
    txns: list[dict[TopicPartition, list[int]]] = field(default_factory=list)
    """Per source transaction: partition -> [first index, last index, events]."""

    def open(self) -> dict[TopicPartition, list[int]]:
        """Start the next source transaction's spans."""
        spans: dict[TopicPartition, list[int]] = {}
        self.txns.append(spans)
        return spans

    def place(self, spans: dict[TopicPartition, list[int]], tp: TopicPartition) -> int:
        """The index in ``tp`` of the next event of the source transaction whose ``spans`` these are."""
        n = self.sent.get(tp, 0)
        self.sent[tp] = n + 1
        at = spans.get(tp)
        if at is None:
            spans[tp] = [n, n, 1]
        else:
            at[1] = n
            at[2] += 1
        return n

    def ready(self, offsets: Mapping[TopicPartition, Mapping[int, int]]) -> bool:
        """Whether the spans can be resolved before the last events' reports (then :meth:`verify` after
        them): every partition's first offset is reported and no topic needs a report per event."""
        return not self.exact and all(0 in offsets[tp] for tp in self.sent)

    def verify(self, offsets: Mapping[TopicPartition, Mapping[int, int]]) -> None:
        """Raise :class:`InterleavedError` where another producer's record lies between the first
        and the last of ours in a partition whose events were not all reported."""
        exact = self.exact
        interleaved = [tp for tp, n in self.sent.items() if tp[0] not in exact
                       and offsets[tp][n - 1] - offsets[tp][0] != n - 1]
        if interleaved:
            raise InterleavedError(interleaved)

    def resolve(self, offsets: Mapping[TopicPartition, Mapping[int, int]], *,
                verify: bool = True) -> list[tuple[Span, ...]]:
        """Each source transaction's spans in offsets, from the delivery reports' ``offsets`` (by index).

        ``verify``: check the last offsets first (:meth:`verify`); without it, the spans hold only
        if a later :meth:`verify` passes, and the caller must not commit them otherwise.
        """
        exact = self.exact
        if verify:
            self.verify(offsets)
        first = {tp: reported[0] for tp, reported in offsets.items() if tp[0] not in exact}
        resolved: list[tuple[Span, ...]] = []
        for spans in self.txns:
            made = []
            for tp, (a, b, n) in spans.items():
                base = first.get(tp)
                if base is None:
                    made.append((tp[0], tp[1], offsets[tp][a], offsets[tp][b], n))
                else:
                    made.append((tp[0], tp[1], base + a, base + b, n))
            if len(made) > 1:
                made.sort()
            resolved.append(tuple(made))
        return resolved

    def encode(self, relay: str, end_lsn: str, txns: Iterable[tuple[str, int, bool]],
               offsets: Mapping[TopicPartition, Mapping[int, int]], *, verify: bool = True) -> tuple[bytes, bytes]:
        """:func:`encode` of :meth:`resolve`'s spans, in one pass: the bytes are the same.

        ``txns``: (id, events, dead-lettered) of each source transaction with events, in the
        group's order; those not dead-lettered are the ones :meth:`open` was called for. The relay
        writes a manifest per Kafka transaction with a span per source transaction and partition;
        building each span's text straight from its indexes, and the summary's bounds from
        :attr:`sent`, is faster than resolving the spans first (docs/benchmarks.md, "Manifest
        spans encoded in one pass").
        """
        exact = self.exact
        if verify:
            self.verify(offsets)
        first = {tp: reported[0] for tp, reported in offsets.items() if tp[0] not in exact}
        prefix = {tp: f"[{json_text(tp[0])},{tp[1]}," for tp in self.sent}
        placed = iter(self.txns)
        parts = []
        multi = 0
        first_id = last_id = None
        for txn, events, dead in txns:
            if dead:
                parts.append(entry_json(txn, events, "", True))
                continue
            spans = next(placed)
            listed = []
            placed_here = 0
            for tp, (a, b, k) in (sorted(spans.items()) if len(spans) > 1 else spans.items()):
                base = first.get(tp)
                if base is None:
                    listed.append(f"{prefix[tp]}{offsets[tp][a]},{offsets[tp][b]},{k}]")
                else:
                    listed.append(f"{prefix[tp]}{base + a},{base + b},{k}]")
                placed_here += k
            if spans:
                multi += placed_here > 1
                first_id = first_id or txn
                last_id = txn
            parts.append(entry_json(txn, events, ",".join(listed), False))
        bounds = {tp: (first[tp], first[tp] + n - 1) if tp in first else (offsets[tp][0], offsets[tp][n - 1])
                  for tp, n in self.sent.items()}
        return assemble(relay, end_lsn, parts, bounds, multi, first_id, last_id)
