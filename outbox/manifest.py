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
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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
        return json.dumps({"v": 1, "relay": self.relay, "end_lsn": self.end_lsn, "txns": [
            {"id": e.txn, "events": e.events, "spans": [list(s) for s in e.spans],
             **({"dead_lettered": True} if e.dead_lettered else {})} for e in self.entries]},
            separators=(",", ":")).encode()

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
