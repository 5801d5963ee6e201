"""The transaction manifest: what one Kafka transaction of the relay carries, written in it.

For each source transaction in the Kafka transaction (group commit puts several in one):
its id as the ingest names it (``<commit LSN>/<xid>``, like ``_tidemark_txn.id``), how
many events it has, and the exact offset span of its events in every partition they went
to, with how many they are there (taken from the delivery reports, before the commit). The record is produced after the
events and before the commit, in the same transaction, so it exists if and only if the
events do: a consumer holding a manifest knows exactly which records make each source
transaction whole, without reading them (G3 from the manifest, ``offsets.cut``).
A source transaction moved to the dead letters instead (``relay.on_oversized``) is listed
with no spans and ``dead_lettered``: accounted for, never half-relayed.

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

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from connectors.producer import TransactionAbortedError

#: (topic, partition, first offset, last offset, events) of one source transaction's events in a
#: partition. ``last - first + 1 == events`` when no other producer's record lies between them.
Span = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class ManifestEntry:
    txn: str
    """``<commit LSN>/<xid>``: the id ``_tidemark_txn.id`` carries in the ingest."""
    events: int
    spans: tuple[Span, ...]
    dead_lettered: bool = False


@dataclass(frozen=True)
class Manifest:
    relay: str
    end_lsn: str
    """The position written with it: the end LSN of its last source transaction."""
    entries: tuple[ManifestEntry, ...]

    def encode(self) -> bytes:
        return self.encoded()[0]

    def encoded(self) -> tuple[bytes, bytes]:
        """The record and its summary header (:func:`encode`)."""
        return encode(self.relay, self.end_lsn, ((e.txn, e.events, e.spans, e.dead_lettered) for e in self.entries))

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("not a Tidemark transaction manifest (v1)")
        return cls(str(data["relay"]), str(data["end_lsn"]), tuple(
            ManifestEntry(str(t["id"]), int(t["events"]),
                          tuple((str(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4])) for s in t["spans"]),
                          bool(t.get("dead_lettered", False)))
            for t in data["txns"]))


#: (topic, partition)
TopicPartition = tuple[str, int]


def _json_text(text: str) -> str:
    """``json.dumps(text)``, written directly for text it escapes nothing in (printable ASCII
    but ``"`` and ``\\``): str's own checks answer for the relay's ids, one per source
    transaction, faster than a regular expression or ``json.dumps``."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


#: The Kafka header a manifest record carries its summary in (:func:`encode`).
SUMMARY_HEADER = "tidemark.manifest.summary"


def encode(relay: str, end_lsn: str, entries: Iterable[tuple[str, int, tuple[Span, ...], bool]]) -> tuple[bytes, bytes]:
    """A manifest record and its summary, in one pass over ``entries`` ((id, events, spans,
    dead-lettered), as :class:`ManifestEntry` holds them).

    The record: the bytes ``json.dumps`` gives its v1 object with compact separators, written
    directly, because the relay writes one per Kafka transaction with an entry per source
    transaction, and building the object first cost more than the rest of the manifest.

    The summary (:data:`SUMMARY_HEADER`): per partition the first and last offset of any
    span, how many source transactions have more than one event, and the first and last id
    of those with events. An ingest's plan reads most records only to learn that all of
    a record lies inside its batch; the summary tells it that without decoding tens of
    thousands of entries (the plan's largest cost, measured on 2 cores), and the
    record itself is decoded only where a cut reaches it.
    """
    names: dict[str, str] = {}
    parts = []
    bounds: dict[tuple[str, int], list[int]] = {}
    multi = 0
    first_id = last_id = None
    for txn, events, spans, dead in entries:
        if len(spans) == 1:  # most source transactions touch one partition: no generator for them
            ((t, p, a, b, n),) = spans
            listed = f"[{names.get(t) or names.setdefault(t, _json_text(t))},{p},{a},{b},{n}]"
        else:
            listed = ",".join(f"[{names.get(t) or names.setdefault(t, _json_text(t))},{p},{a},{b},{n}]"
                              for t, p, a, b, n in spans)
            n = sum(s[4] for s in spans)
        for t, p, a, b, _ in spans:
            seen = bounds.get((t, p))
            if seen is None:
                bounds[(t, p)] = [a, b]
            else:
                seen[0], seen[1] = min(seen[0], a), max(seen[1], b)
        if spans:
            multi += n > 1
            first_id = first_id or txn
            last_id = txn
        parts.append(_entry(txn, events, listed, dead))
    return _assemble(relay, end_lsn, parts, bounds, multi, first_id, last_id)


def _entry(txn: str, events: int, listed: str, dead: bool) -> str:
    """One source transaction's entry, its spans already written as JSON (``listed``)."""
    tail = ',"dead_lettered":true}' if dead else "}"
    return f'{{"id":{_json_text(txn)},"events":{events},"spans":[{listed}]{tail}'


def _assemble(relay: str, end_lsn: str, parts: list[str], bounds: Mapping[TopicPartition, Sequence[int]],
              multi: int, first_id: str | None, last_id: str | None) -> tuple[bytes, bytes]:
    """The record around its entries' JSON ``parts``, and its summary (see :func:`encode`)."""
    record = (f'{{"v":1,"relay":{_json_text(relay)},"end_lsn":{_json_text(end_lsn)},"txns":[' + ",".join(parts)
              + "]}").encode()
    summary = json.dumps({"v": 1, "relay": relay, "parts": [[t, p, a, b] for (t, p), (a, b) in sorted(bounds.items())],
                          "multi": multi, "first": first_id, "last": last_id}, separators=(",", ":")).encode()
    return record, summary


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
        writes a manifest per Kafka transaction with a span per source transaction and partition
        (some 3,500 for a group of 500 ten-event transactions over 9 partitions); building each
        span's text straight from its indexes, and the summary's bounds from :attr:`sent`, takes
        half the time of resolving the spans first (measured on 2 cores).
        """
        exact = self.exact
        if verify:
            self.verify(offsets)
        first = {tp: reported[0] for tp, reported in offsets.items() if tp[0] not in exact}
        prefix = {tp: f"[{_json_text(tp[0])},{tp[1]}," for tp in self.sent}
        placed = iter(self.txns)
        parts = []
        multi = 0
        first_id = last_id = None
        for txn, events, dead in txns:
            if dead:
                parts.append(_entry(txn, events, "", True))
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
            parts.append(_entry(txn, events, ",".join(listed), False))
        bounds = {tp: (first[tp], first[tp] + n - 1) if tp in first else (offsets[tp][0], offsets[tp][n - 1])
                  for tp, n in self.sent.items()}
        return _assemble(relay, end_lsn, parts, bounds, multi, first_id, last_id)
