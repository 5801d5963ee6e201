"""The relay-to-ingest wire format, defined once: the headers the relay stamps on every
event and the manifest record it writes in every Kafka transaction. The relay writes them
(:mod:`outbox.grouping`, :mod:`outbox.manifest`); the ingest reads them
(:mod:`pipelines.transactions`); both import their names, layouts and version from here,
and ``tests/unit/test_wire.py`` round-trips every field.

**Versions.** The manifest record and its summary header carry ``"v": VERSION``; a reader
takes only the versions it knows and treats any other record as not listing anything (the
batch's guard, or the scan, then decides: slower, never wrong). Event headers evolve by
addition only: a reader ignores headers it does not know, and a change in what an existing
header means takes a new header name.

**Event headers.**
``id`` and ``type`` are Debezium's outbox names. The ``tidemark.*`` headers describe the
source transaction the event came from, so a consumer can tell whether it holds all of
that transaction's events for the topics it reads:

* ``tidemark.txid``: the PostgreSQL transaction id;
* ``tidemark.lsn``: the transaction's commit LSN, unique and increasing in commit order;
* ``tidemark.position``: the event's index in the transaction, 0-based;
* ``tidemark.size``: how many events the transaction has;
* ``tidemark.topic_counts``: JSON object, topic -> how many of them went to that topic;
* ``tidemark.source``: ``<relay id>:<commit LSN as 16 hex digits>``: which relay's manifest
  lists the transaction, and where it stands in that relay's commit order. Fixed width, so
  text order is commit order: an ingest cut from the manifest checks its write with one
  range comparison per relay.

**The manifest record** (``transactions.manifest_topic``):
For each source transaction in the Kafka transaction (group commit puts several in one):
its id as the ingest names it (``<commit LSN>/<xid>``, like ``_tidemark_txn.id``), how
many events it has, and the exact offset span of its events in every partition they went
to, with how many they are there (taken from the delivery reports, before the commit). The record is produced after the
events and before the commit, in the same transaction, so it exists if and only if the
events do: a consumer holding a manifest knows exactly which records make each source
transaction whole, without reading them (G3 from the manifest, ``offsets.cut``).
A source transaction moved to the dead letters instead (``relay.on_oversized``) is listed
with no spans and ``dead_lettered``: accounted for, never half-relayed.
The relay places events so that it knows these spans from two delivery reports per
partition (:class:`outbox.manifest.Placement`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outbox.pgoutput import format_lsn

#: The manifest's layout version, in the record and in its summary.
VERSION = 1

EVENT_ID = "id"
EVENT_TYPE = "type"
TXID = "tidemark.txid"
LSN = "tidemark.lsn"
POSITION = "tidemark.position"
SIZE = "tidemark.size"
TOPIC_COUNTS = "tidemark.topic_counts"
SOURCE = "tidemark.source"


def source(relay_id: str, commit_lsn: int) -> str:
    """The ``tidemark.source`` value of a transaction."""
    return f"{relay_id}:{commit_lsn:016X}"


def txn_headers(relay_id: str, xid: int, commit_lsn: int, size: int, counts: bytes) -> list[tuple[str, bytes]]:
    """The headers every event of one source transaction shares (:data:`POSITION` comes per
    event, with :data:`EVENT_ID` and :data:`EVENT_TYPE`); ``counts`` is the
    :data:`TOPIC_COUNTS` JSON."""
    return [(TXID, str(xid).encode()), (LSN, format_lsn(commit_lsn).encode()), (SIZE, str(size).encode()),
            (TOPIC_COUNTS, counts), (SOURCE, source(relay_id, commit_lsn).encode())]


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
        if not isinstance(data, dict) or data.get("v") != VERSION:
            raise ValueError(f"not a Tidemark transaction manifest (v{VERSION})")
        return cls(str(data["relay"]), str(data["end_lsn"]), tuple(
            ManifestEntry(str(t["id"]), int(t["events"]),
                          tuple((str(s[0]), int(s[1]), int(s[2]), int(s[3]), int(s[4])) for s in t["spans"]),
                          bool(t.get("dead_lettered", False)))
            for t in data["txns"]))


#: (topic, partition)
TopicPartition = tuple[str, int]


def json_text(text: str) -> str:
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
            listed = f"[{names.get(t) or names.setdefault(t, json_text(t))},{p},{a},{b},{n}]"
        else:
            listed = ",".join(f"[{names.get(t) or names.setdefault(t, json_text(t))},{p},{a},{b},{n}]"
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
        parts.append(entry_json(txn, events, listed, dead))
    return assemble(relay, end_lsn, parts, bounds, multi, first_id, last_id)


def entry_json(txn: str, events: int, listed: str, dead: bool) -> str:
    """One source transaction's entry, its spans already written as JSON (``listed``)."""
    tail = ',"dead_lettered":true}' if dead else "}"
    return f'{{"id":{json_text(txn)},"events":{events},"spans":[{listed}]{tail}'


def assemble(relay: str, end_lsn: str, parts: list[str], bounds: Mapping[TopicPartition, Sequence[int]],
              multi: int, first_id: str | None, last_id: str | None) -> tuple[bytes, bytes]:
    """The record around its entries' JSON ``parts``, and its summary (see :func:`encode`)."""
    record = (f'{{"v":{VERSION},"relay":{json_text(relay)},"end_lsn":{json_text(end_lsn)},"txns":[' + ",".join(parts)
              + "]}").encode()
    summary = json.dumps({"v": VERSION, "relay": relay, "parts": [[t, p, a, b] for (t, p), (a, b) in sorted(bounds.items())],
                          "multi": multi, "first": first_id, "last": last_id}, separators=(",", ":")).encode()
    return record, summary


def decode_record(raw: bytes) -> tuple[str, list[Any]] | None:
    """(relay, its entries as JSON lists and objects) of a manifest record of this
    :data:`VERSION`, or None for anything else. By orjson: a batch reads tens of thousands of
    entries, 1.75x as fast as by ``json``; the ingest reads the entries lazily from these."""
    import orjson

    try:
        data = orjson.loads(raw)
        if data.get("v") != VERSION or not isinstance(data["txns"], list):
            return None
        return str(data["relay"]), data["txns"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Summary:
    """A manifest record's :data:`SUMMARY_HEADER`: what most of a batch's reads need of a record."""

    relay: str
    parts: tuple[tuple[str, int, int, int], ...]
    """Per partition: (topic, partition, first offset, last offset) of any span."""
    multi: int
    """How many source transactions have more than one event."""
    first: str
    last: str
    """The first and the last id of the transactions with events."""


def decode_summary(raw: bytes) -> Summary | None:
    """The summary header of this :data:`VERSION`, or None (no events listed, or not readable:
    the record itself still says it all)."""
    import orjson

    try:
        data = orjson.loads(raw)
        if data.get("v") != VERSION or data["first"] is None or data["last"] is None:
            return None
        parts = tuple((str(t), int(p), int(a), int(b)) for t, p, a, b in data["parts"])
        return Summary(str(data["relay"]), parts, int(data["multi"]), str(data["first"]), str(data["last"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
