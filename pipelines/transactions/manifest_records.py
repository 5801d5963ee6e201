"""What one manifest record lists for a batch's proposal, read without building what no cut needs.

A batch reads tens of thousands of manifest entries, and most of them lie wholly inside
its proposal, where no cut ever reaches them. So a record is read, fastest first, from
its summary header alone, or as one unexpanded block of its entries, and only a record
that reaches past the proposal is read entry by entry. Reading a record is pure (no
Kafka client here); :mod:`pipelines.transactions.manifest` decides which records to read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from offsets.cut import Listed, ListedBlock, ListedTxn, RelayRanges
from offsets.ledger import TP, Intent
from outbox.wire import SUMMARY_HEADER, decode_record, decode_summary

Limits = Mapping[str, Mapping[int, tuple[int, int]]]
"""Per topic and partition, a proposal's ``[start, end)``."""


def proposal_limits(intent: Intent) -> dict[str, dict[int, tuple[int, int]]]:
    """``intent``'s ranges as :data:`Limits`."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for r in intent.ranges:
        out.setdefault(r.topic, {})[r.partition] = (r.start, r.end)
    return out


def _entries(txns: list[Any], mine: Callable[[str], bool]) -> list[ListedTxn]:
    """Each transaction with its spans in this pipeline's topics (dead-lettered ones have none)."""
    try:
        return [ListedTxn(t["id"], tuple(((s[0], s[1]), s[2], s[3], s[4]) for s in t["spans"] if mine(s[0])))
                for t in txns if not t.get("dead_lettered")]
    except (KeyError, TypeError, IndexError, AttributeError):
        return []


def _block(txns: list[Any], limits: Limits, mine: Callable[[str], bool]) -> tuple[ListedBlock, list[str]] | None:
    """The record's transactions as one block when every span of theirs in this pipeline's
    topics lies inside the proposal (the common case in a batch's middle), with the first
    and last of their ids; else None. One plain loop over the spans; no per-transaction
    object is built."""
    last: dict[TP, int] = {}
    count = 0
    first_id = last_id = None
    try:
        for t in txns:
            if t.get("dead_lettered"):
                continue
            events = 0
            for s in t["spans"]:
                parts = limits.get(s[0])
                if parts is None:
                    if mine(s[0]):
                        return None  # a partition of ours outside the proposal
                    continue
                bounds = parts.get(s[1])
                if bounds is None or s[2] < bounds[0] or s[3] >= bounds[1]:
                    return None
                tp = (s[0], s[1])
                if last.get(tp, -1) < s[3]:
                    last[tp] = s[3]
                events += s[4]
            if events > 1:
                count += 1
            if events:
                first_id = first_id or t["id"]
                last_id = t["id"]
    except (KeyError, TypeError, IndexError, AttributeError):
        return None
    if first_id is None or last_id is None:
        return None  # nothing of ours: the full path decides (it lists nothing either)
    block = ListedBlock(tuple(last.items()), count, lambda: tuple(t for t in _entries(txns, mine) if t.spans))
    return block, [str(first_id), str(last_id)]


def _summarized(message: Any, limits: Limits, mine: Callable[[str], bool]) -> tuple[str, ListedBlock, list[str]] | None:
    """What :func:`_block` makes of a manifest record, from its summary header alone
    (:data:`outbox.wire.SUMMARY_HEADER`): (relay, block, first and last id), or None
    where the record must be decoded: no or unreadable summary, a partition outside the
    proposal, nothing of ours, or a topic this pipeline does not read (the summary's count
    of multi-event transactions is over all of the record's topics). The record's entries
    are decoded only if a cut reaches the block or a wait names one of them."""
    raw = next((v for k, v in message.headers() or () if k == SUMMARY_HEADER), None)
    summary = None if raw is None else decode_summary(raw)
    if summary is None:
        return None
    last = []
    for topic, partition, first, end in summary.parts:
        bounds = limits.get(topic, {}).get(partition)
        if bounds is None or not mine(topic) or first < bounds[0] or end >= bounds[1]:
            return None
        last.append(((topic, partition), end))
    relay, count, ids = summary.relay, summary.multi, [summary.first, summary.last]
    value = message.value() or b""

    def expand() -> tuple[ListedTxn, ...]:
        decoded = decode_record(value)
        return tuple(t for t in _entries(decoded[1], mine) if t.spans) if decoded is not None else ()
    return relay, ListedBlock(tuple(last), count, expand), ids


def read_record(message: Any, limits: Limits, mine: Callable[[str], bool], starts: Mapping[TP, int],
                ends: Mapping[TP, int]) -> tuple[str, list[Listed], list[str], tuple[tuple[TP, int], ...]]:
    """:func:`_take` of one manifest record, with its relay: from the summary where it suffices."""
    quick = _summarized(message, limits, mine)
    if quick is not None:
        relay, block, ids = quick
        return relay, [block], ids, block.last
    decoded = decode_record(message.value() or b"")
    relay, txns = decoded if decoded is not None else ("", [])
    return relay, *_take(txns, limits, mine, starts, ends)


def _touches(spans: tuple[tuple[TP, int, int, int], ...], starts: Mapping[TP, int], ends: Mapping[TP, int]) -> bool:
    return any(tp in ends and first < ends[tp] and last >= starts[tp] for tp, first, last, _ in spans)


def _take(txns: list[Any], limits: Limits, mine: Callable[[str], bool], starts: Mapping[TP, int],
          ends: Mapping[TP, int]) -> tuple[list[Listed], list[str], tuple[tuple[TP, int], ...]]:
    """One manifest record read against a proposal: what it lists there (a block, or the
    transactions with an event inside), the ids of those for the guard's LSN range (a block's
    first and last suffice: a record lists its transactions in commit order), and each
    partition's last offset in it (where a read stops: :class:`Frontier`)."""
    as_block = _block(txns, limits, mine)
    if as_block is not None:
        block, ids = as_block
        return [block], ids, block.last
    entries = _entries(txns, mine)
    listed: list[Listed] = [t for t in entries if _touches(t.spans, starts, ends)]
    lasts = tuple((tp, last) for t in entries for tp, _, last, _ in t.spans)
    return listed, [t.txn for t in listed if isinstance(t, ListedTxn)], lasts


class Frontier:
    """Where a manifest read of a proposal may stop: once every relay met has passed every
    partition the proposal reads something of.

    A relay's records follow its events' order, so once one of its records has an event at
    or past a partition's end, none of its later records has an event of that partition
    inside the proposal. Until it has passed every such partition, a later record of it may
    still list a transaction inside: a proposal capped unevenly ends at very different
    moments per partition, and records entirely past one partition's end can come before
    records inside another's. (A relay not met yet is not known; the batch's guard covers it.)
    """

    def __init__(self, intent: Intent) -> None:
        self.ends = {r.tp: r.end for r in intent.ranges}
        self.reading = frozenset(r.tp for r in intent.ranges if r.span)
        self.passed: dict[str, set[TP]] = {}

    def see(self, relay: str, lasts: tuple[tuple[TP, int], ...]) -> None:
        """A record of ``relay`` whose spans end at ``lasts`` (per partition, an event's offset)."""
        passed = self.passed.setdefault(relay, set())
        passed.update(tp for tp, last in lasts if tp in self.ends and last >= self.ends[tp])

    def reached(self) -> bool:
        return bool(self.passed) and all(self.reading <= passed for passed in self.passed.values())


def topic_memo(mine: Callable[[str], bool]) -> Callable[[str], bool]:
    """``mine``, asked once per topic: a read meets the same few topics in every record."""
    known: dict[str, bool] = {}

    def cached(topic: str) -> bool:
        hit = known.get(topic)
        if hit is None:
            hit = known[topic] = mine(topic)
        return hit
    return cached


def _commit_lsn(txn: str) -> int | None:
    from outbox.pgoutput import DecodeError, parse_lsn

    try:
        return parse_lsn(txn.rsplit("/", 1)[0])
    except DecodeError:
        return None


def relay_ranges(found: Mapping[str, list[str]]) -> RelayRanges:
    """Per relay, the lowest and highest commit LSN among the transaction ids ``found`` (what the guard lets be)."""
    out = []
    for relay, txns in sorted(found.items()):
        lsns = [lsn for lsn in map(_commit_lsn, txns) if lsn is not None]
        if lsns:
            out.append((relay, min(lsns), max(lsns)))
    return tuple(out)
