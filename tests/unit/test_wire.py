"""The relay-to-ingest wire format (outbox.wire), written as the relay writes it and read back as
the ingest reads it: every header and every manifest field round-trips, and a version a reader
does not know is never read as if it were its own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox import wire
from outbox.pgoutput import format_lsn
from pipelines.transactions.headers import declared, txn_of
from pipelines.transactions.manifest_records import read_record

RELAY = 'relay "eu-1"'
LSN = 0x16_B374_D848
ENTRIES = (
    wire.ManifestEntry(f"{format_lsn(LSN)}/731", 3, (("orders", 0, 10, 11, 2), ("pay\u00e9", 2, 40, 40, 1))),
    wire.ManifestEntry(f"{format_lsn(LSN + 8)}/732", 1, (("orders", 1, 5, 5, 1),)),
    wire.ManifestEntry(f"{format_lsn(LSN + 16)}/733", 4, (), dead_lettered=True),
    wire.ManifestEntry(f"{format_lsn(LSN + 24)}/7\"34", 2, (("orders", 0, 12, 14, 2),)),
)


class _Message:
    """A consumed manifest record, as confluent-kafka gives it to the ingest's reads."""

    def __init__(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self._value, self._headers = value, headers

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def test_a_manifest_round_trips_every_field() -> None:
    manifest = wire.Manifest(RELAY, format_lsn(LSN + 32), ENTRIES)
    record, summary = manifest.encoded()
    assert wire.Manifest.decode(record) == manifest
    assert json.loads(record)["v"] == wire.VERSION == json.loads(summary)["v"]
    relay, txns = wire.decode_record(record) or ("", [])
    assert relay == RELAY
    assert [(t["id"], t["events"], [tuple(s) for s in t["spans"]], t.get("dead_lettered", False)) for t in txns] \
        == [(e.txn, e.events, list(e.spans), e.dead_lettered) for e in ENTRIES]


def test_the_summary_says_what_the_entries_say() -> None:
    _, raw = wire.Manifest(RELAY, format_lsn(LSN), ENTRIES).encoded()
    summary = wire.decode_summary(raw)
    assert summary is not None and summary.relay == RELAY
    # Per partition the first and last offset of any span; the multi-event transactions; the ids of those with events.
    assert summary.parts == (("orders", 0, 10, 14), ("orders", 1, 5, 5), ("pay\u00e9", 2, 40, 40))
    assert summary.multi == 2 and (summary.first, summary.last) == (ENTRIES[0].txn, ENTRIES[3].txn)


def test_the_ingest_reads_the_relays_record_into_what_its_cut_takes() -> None:
    """A record wholly inside the proposal is one block from its summary; the same record read past
    the proposal's end lists the transactions with an event inside, spans as the relay wrote them."""
    record, summary = wire.Manifest(RELAY, format_lsn(LSN), ENTRIES).encoded()
    message = _Message(record, [(wire.SUMMARY_HEADER, summary)])
    every = {"orders": {0: (0, 100), 1: (0, 100)}, "pay\u00e9": {2: (0, 100)}}
    relay, listed, ids, lasts = read_record(message, every, lambda t: True, {}, {})
    assert relay == RELAY and ids == [ENTRIES[0].txn, ENTRIES[3].txn] and len(listed) == 1
    assert dict(lasts) == {("orders", 0): 14, ("orders", 1): 5, ("pay\u00e9", 2): 40}
    expanded = listed[0].expand()  # type: ignore[union-attr]
    assert [(t.txn, t.spans) for t in expanded] == [
        (e.txn, tuple(((s[0], s[1]), s[2], s[3], s[4]) for s in e.spans)) for e in ENTRIES if e.spans]
    short = {"orders": {0: (0, 12), 1: (0, 100)}, "pay\u00e9": {2: (0, 100)}}
    ends = {tp: bounds[1] for topic, parts in short.items() for tp, bounds in
            (((topic, p), b) for p, b in parts.items())}
    starts = dict.fromkeys(ends, 0)
    relay, listed, ids, _ = read_record(_Message(record, []), short, lambda t: True, starts, ends)
    # The last transaction starts at orders[0]'s end: past the proposal, so not listed in it.
    assert relay == RELAY and ids == [ENTRIES[0].txn, ENTRIES[1].txn] == [t.txn for t in listed]  # type: ignore[union-attr]


def test_an_events_headers_name_the_transaction_its_manifest_entry_lists() -> None:
    counts = json.dumps({"orders": 2, "pay\u00e9": 1}, separators=(",", ":")).encode()
    shared = wire.txn_headers(RELAY, 731, LSN, 3, counts)
    memo: dict[Any, Any] = {}
    for position in range(3):
        headers = [(wire.EVENT_ID, b"e%d" % position), (wire.EVENT_TYPE, b"Paid"), *shared,
                   (wire.POSITION, str(position).encode())]
        assert txn_of(headers, lambda t: t == "orders", memo) == (ENTRIES[0].txn, position, 2)
    assert declared(memo) == {ENTRIES[0].txn: {"orders": 2}}
    found = dict(shared)
    assert found[wire.SOURCE] == f"{RELAY}:{LSN:016X}".encode() == wire.source(RELAY, LSN).encode()
    assert (found[wire.TXID], found[wire.LSN], found[wire.SIZE]) == (b"731", format_lsn(LSN).encode(), b"3")


@pytest.mark.parametrize("version", [0, wire.VERSION + 1])
def test_a_version_the_reader_does_not_know_is_not_read_as_its_own(version: int) -> None:
    record, summary = wire.Manifest(RELAY, format_lsn(LSN), ENTRIES).encoded()
    other = json.dumps({**json.loads(record), "v": version}).encode()
    assert wire.decode_record(other) is None
    assert wire.decode_summary(json.dumps({**json.loads(summary), "v": version}).encode()) is None
    with pytest.raises(ValueError, match="not a Tidemark transaction manifest"):
        wire.Manifest.decode(other)
    relay, listed, ids, _ = read_record(_Message(other, []), {"orders": {0: (0, 100)}}, lambda t: True, {}, {})
    assert (relay, listed, ids) == ("", [], [])
