"""Where to cut a batch so every source transaction lands whole (G3): pure logic, no I/O.

The planner proposes ``[start, end)`` per partition. A source transaction (the events one
database transaction wrote, stamped by the relay) may have events in several partitions
and topics, and the proposed ends may fall between them: a record cap, an LSO that has
passed the commit marker in one partition but not yet in another, or a transaction that
will never be whole (events lost to retention, never produced, on a topic not read). So:

1. A transaction is *whole* when the proposed ranges hold every event it declares for
   this pipeline's topics and all of them lie before the ends.
2. Every other transaction with an event before an end pulls that partition's end down
   to its first event there, in every partition it touches.
3. Cutting can split a transaction that was whole, so step 2 repeats until no end
   moves. Ends only decrease, so this stops; the result is the largest cut in which
   every transaction with an event inside is whole.

A transaction the proposal holds only part of is *incomplete here*, which says nothing
about Kafka: the rest may simply lie past a capped end. So before anything is released,
the events it misses are searched for past the proposal, up to each partition's LSO, in
the partitions of the topics still owing it events (:func:`search_regions`). Found: it
is whole in Kafka and merely waits for a later batch. Not found below the LSO: it is
*missing at the readable frontier*, and only from the first batch that saw that does its
wait count (:class:`Wait`, carried from intent to intent in the ledger, so a restart
neither resets nor shortens it). Past ``incomplete_timeout_seconds`` of such waiting it
is *released*: taken as it is, flagged in its rows, instead of holding its partitions
back forever. The decision is stored with the batch's intent, so a replay writes the same
rows without asking the clock again.

For topics the relay writes, its manifest lists every source transaction's exact spans,
so the same spans and verdict come from the manifest with no read of the records
(:func:`listed_spans`); both paths give the same cut on the same data.

A batch's plan gathers its facts first, by reading Kafka (``pipelines.transactions``):
either a :class:`ManifestRead`, or the planning scan's spans plus what the search past the
proposal met (:class:`Scanned`; where to search is itself decided here,
:func:`searches`). Then :func:`decide` makes the whole decision from those facts in one
call: the verdict, the policy for overdue transactions, the cut, and the intent as the
ledger will store it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from offsets.ledger import TP, Intent, Range, Wait
from tidemark.config import TransactionsConfig
from tidemark.errors import TerminalError


class IncompleteTransactionError(TerminalError):
    """A source transaction stayed incomplete past its timeout and the policy is ``stop``."""


@dataclass(frozen=True)
class TxnSpan:
    """What the proposed ranges hold of one multi-event source transaction."""

    txn: str
    seen: int
    """Distinct events of the transaction in the proposed ranges."""
    expected: int
    """Events it declares for this pipeline's topics."""
    offsets: Mapping[TP, tuple[int, int]]
    """Per partition: (first, last) offset of its events there."""
    declared: Mapping[str, int] | None = None
    """Events it declares per topic this pipeline reads; None when the per-topic count is
    unreadable (``expected`` is then its size, and any of the pipeline's topics may owe it)."""
    seen_by_topic: Mapping[str, int] = field(default_factory=dict)
    """Distinct events seen per topic."""
    positions: frozenset[int] = frozenset()
    """Positions of the events seen; filled for incomplete transactions only (the search needs them)."""

    @property
    def complete(self) -> bool:
        return self.seen >= self.expected

    def owing_topics(self) -> frozenset[str] | None:
        """Topics that still owe it events; None: any of the pipeline's topics may."""
        if self.declared is None:
            return None
        return frozenset(t for t, n in self.declared.items() if self.seen_by_topic.get(t, 0) < n)


@dataclass(frozen=True)
class Cut:
    ranges: tuple[Range, ...]
    released: tuple[str, ...]
    """Incomplete transactions taken as they are, past their timeout."""
    held: tuple[str, ...]
    """Transactions left for a later batch (incomplete, or split by the cut)."""


def search_regions(incomplete: Iterable[TxnSpan], ends: Mapping[TP, int], lso: Mapping[TP, int],
                   waits: Mapping[str, Wait]) -> dict[str, dict[TP, tuple[int, int]]]:
    """Per incomplete transaction, the ``[from, LSO)`` of each partition that may hold its missing events.

    The partitions of the topics still owing it events, from the proposal's end; for a
    transaction already waiting, from where the last search stopped (what lies before
    was searched, and what it found is in its :class:`Wait`). A region that would be
    empty (already at the LSO) is left out.
    """
    out: dict[str, dict[TP, tuple[int, int]]] = {}
    for span in incomplete:
        owing = span.owing_topics()
        wait = waits.get(span.txn)
        regions: dict[TP, tuple[int, int]] = {}
        for tp, end in lso.items():
            if owing is not None and tp[0] not in owing:
                continue
            start = ends.get(tp, end)
            if wait is not None and tp in wait.searched:
                start = max(start, wait.searched[tp])
            if start < end:
                regions[tp] = (start, end)
        out[span.txn] = regions
    return out


@dataclass(frozen=True)
class Verdict:
    """What the search beyond the proposal decided for a batch's incomplete transactions."""

    whole_in_kafka: tuple[str, ...]
    """Every event is below the LSO; they wait (held) only for a batch that reaches them."""
    waits: dict[str, Wait]
    """Transactions missing events at the readable frontier, and those not seen in this batch."""
    overdue: tuple[TxnSpan, ...]
    """Missing for at least the timeout: the policy decides (release or stop)."""


def judge(spans: Iterable[TxnSpan], found: Mapping[str, frozenset[int]], lso: Mapping[TP, int],
          waits: Mapping[str, Wait], planned_at: datetime, timeout: timedelta) -> Verdict:
    """Classify a batch's transactions after the search (``found``: positions met past the proposal).

    ``waits`` is the previous batch's; the result's replaces it. A transaction waiting
    before but absent from this batch's proposal keeps its wait (the cut keeps each
    held transaction's partitions at or before its first event, so it comes back).
    """
    all_spans = list(spans)
    whole: list[str] = []
    new_waits: dict[str, Wait] = {}
    overdue: list[TxnSpan] = []
    for span in all_spans:
        if span.complete:
            continue
        before = waits.get(span.txn)
        have = span.positions | found.get(span.txn, frozenset()) | (before.found if before else frozenset())
        if len(have) >= span.expected:
            whole.append(span.txn)
            continue
        owing = span.owing_topics()
        wait = Wait(since=before.since if before else planned_at,
                    searched={tp: end for tp, end in lso.items() if owing is None or tp[0] in owing},
                    found=frozenset(have))
        new_waits[span.txn] = wait
        if planned_at - wait.since >= timeout:
            overdue.append(span)
    seen = {s.txn for s in all_spans}
    new_waits |= {txn: wait for txn, wait in waits.items() if txn not in seen}
    return Verdict(tuple(sorted(whole)), new_waits, tuple(overdue))


@dataclass(frozen=True)
class ListedTxn:
    """A source transaction as the relay's manifest lists it, restricted to this pipeline's topics."""

    txn: str
    spans: tuple[tuple[TP, int, int, int], ...]
    """Per partition: (partition, first offset, last offset, events there)."""

    @property
    def expected(self) -> int:
        return sum(n for _, _, _, n in self.spans)

    def reached(self, ends: Mapping[TP, int]) -> bool:
        return any(last >= ends.get(tp, last + 1) for tp, _, last, _ in self.spans)


@dataclass(frozen=True)
class ListedBlock:
    """Listed transactions lying wholly inside a proposal, kept unexpanded: one manifest
    record's worth, which in a batch's middle (most of it) no cut ever reaches."""

    last: tuple[tuple[TP, int], ...]
    """Per partition, the last offset of any of their events."""
    txns: int
    """How many of them are multi-event here."""
    expand: Callable[[], tuple[ListedTxn, ...]]
    """The transactions themselves, built only when a cut reaches the block or a wait names one."""

    def reached(self, ends: Mapping[TP, int]) -> bool:
        return any(last >= ends.get(tp, last + 1) for tp, last in self.last)


Listed = ListedTxn | ListedBlock


def listed_spans(listed: Iterable[Listed], ranges: Iterable[Range], lso: Mapping[TP, int],
                 waits: Mapping[str, Wait], planned_at: datetime,
                 timeout: timedelta) -> tuple[list[TxnSpan], list[Listed], Verdict, int]:
    """What the scan and :func:`judge` decide, from the manifest instead of the records.

    The manifest says where every event of a listed transaction is, so nothing is searched:
    a transaction is whole in Kafka when each of its spans lies at or past its partition's
    start and below its LSO; otherwise its missing events are not readable by this pipeline
    (before its start, on a partition it does not read) and it waits like any other.
    Returns the spans :func:`cut_ranges` needs for the transactions that are not wholly
    inside the proposal (events inside it counted from whole spans only), the wholly inside
    ones apart (most of a batch, and they move no end: :func:`cut_with_inside` adds them only
    if a cut reaches them; blocks of them the caller already knows to be inside stay
    unexpanded), the verdict in the same form as the scan's, and how many multi-event
    transactions have an event in the proposal.
    """
    proposal = tuple(ranges)
    starts = {r.tp: r.start for r in proposal}
    ends = {r.tp: r.end for r in proposal}
    found: list[TxnSpan] = []
    inside_whole: list[Listed] = []
    whole: list[str] = []
    new_waits: dict[str, Wait] = {}
    overdue: list[TxnSpan] = []
    seen_txns: set[str] = set()
    count = 0
    for item in listed:
        if isinstance(item, ListedBlock):
            inside_whole.append(item)
            count += item.txns
            if waits:  # a wait ends once its transaction is seen whole
                seen_txns |= {t.txn for t in item.expand()}
            continue
        if item.expected <= 1:
            continue  # one event here: whole by definition
        if all(tp in ends and first >= starts[tp] and last < ends[tp] for tp, first, last, _ in item.spans):
            inside_whole.append(item)
            seen_txns.add(item.txn)
            count += 1
            continue
        inside = {tp: (first, last) for tp, first, last, _ in item.spans
                  if tp in ends and first < ends[tp] and last >= starts[tp]}
        if not inside:
            continue  # nothing of it in this batch
        seen = sum(n for tp, first, last, n in item.spans if tp in ends and first >= starts[tp] and last < ends[tp])
        span = TxnSpan(item.txn, seen, item.expected, inside)
        found.append(span)
        seen_txns.add(item.txn)
        count += 1
        if all(tp in ends and first >= starts[tp] and last < lso.get(tp, 0) for tp, first, last, _ in item.spans):
            whole.append(item.txn)
            continue
        before = waits.get(item.txn)
        wait = Wait(since=before.since if before else planned_at, searched={})
        new_waits[item.txn] = wait
        if planned_at - wait.since >= timeout:
            overdue.append(span)
    new_waits |= {txn: wait for txn, wait in waits.items() if txn not in seen_txns}
    verdict = Verdict(tuple(sorted(whole)), new_waits, tuple(overdue))
    return found, inside_whole, verdict, count


def cut_with_inside(ranges: Iterable[Range], spans: Iterable[TxnSpan], inside: Iterable[Listed],
                    released: Iterable[str] = ()) -> Cut:
    """:func:`cut_ranges` of ``spans``, taking in a wholly inside transaction only once a cut reaches it.

    The same cut as with every transaction given (one inside every end moves none, until an
    end falls to or below one of its events), at the cost of the few near the ends. A block
    a cut reaches is expanded into its transactions, which are then judged one by one.
    """
    proposal, free = tuple(ranges), tuple(released)
    tracked, pending = list(spans), list(inside)
    while True:
        cut = cut_ranges(proposal, tracked, free)
        ends = {r.tp: r.end for r in cut.ranges}
        reached = [t for t in pending if t.reached(ends)] if pending else []
        if not reached:
            return cut
        blocks = {id(t) for t in reached if isinstance(t, ListedBlock)}
        if blocks:
            pending = [t for t in pending if id(t) not in blocks]
            pending += [t for b in reached if isinstance(b, ListedBlock) for t in b.expand() if t.expected > 1]
            continue
        names = {t.txn for t in reached if isinstance(t, ListedTxn)}
        tracked += [TxnSpan(t.txn, t.expected, t.expected, {tp: (first, last) for tp, first, last, _ in t.spans})
                    for t in reached if isinstance(t, ListedTxn)]
        pending = [t for t in pending if not isinstance(t, ListedTxn) or t.txn not in names]


def cut_ranges(ranges: Iterable[Range], spans: Iterable[TxnSpan], released: Iterable[str] = ()) -> Cut:
    """The largest cut of ``ranges`` in which every transaction with an event inside is whole."""
    proposed = tuple(ranges)
    ends = {r.tp: r.end for r in proposed}
    free = set(released)
    tracked = [s for s in spans if s.txn not in free]
    held: set[str] = set()
    moved = True
    while moved:
        moved = False
        for span in tracked:
            inside = [tp for tp, (first, _) in span.offsets.items() if first < ends.get(tp, first)]
            if not inside:
                continue  # wholly after the cut: a later batch's
            whole = span.complete and all(last < ends.get(tp, last) for tp, (_, last) in span.offsets.items())
            if whole:
                continue
            held.add(span.txn)
            for tp in inside:
                ends[tp] = span.offsets[tp][0]
                moved = True
    # A transaction that moved no end may still sit wholly after the cut: report it too.
    held |= {s.txn for s in tracked
             if any(last >= ends.get(tp, last + 1) for tp, (_, last) in s.offsets.items())}
    cut = tuple(Range(r.topic, r.partition, r.start, max(r.start, min(r.end, ends[r.tp]))) for r in proposed)
    seen_released = tuple(sorted(s.txn for s in spans if s.txn in free))
    return Cut(cut, seen_released, tuple(sorted(held)))


#: Per relay, the commit LSNs ``[low, high]`` of the source transactions a manifest read listed.
RelayRanges = tuple[tuple[str, int, int], ...]

#: Per manifest record read: its offset and each of its spans' (partition, last offset).
RecordLasts = tuple[tuple[int, tuple[tuple[TP, int], ...]], ...]


@dataclass(frozen=True)
class ManifestRead:
    """What one read of the manifest found for a batch's proposed ranges: the facts of a cut from it."""

    start: int
    end: int
    """Manifest offsets read: ``[start, end)``."""
    listed: tuple[Listed, ...]
    """Transactions with an event inside the proposed ranges (records wholly inside as blocks)."""
    relays: RelayRanges
    """Per relay, the commit LSNs of its listed transactions (what the batch's write lets be)."""
    records: RecordLasts
    """Per record read: its offset and each of its spans' (partition, last offset): where the next read starts."""

    def next_cursor(self, ends: Mapping[TP, int]) -> int:
        """The first record with an event at or past ``ends`` (a later batch's); ``end`` when none."""
        for offset, spans in self.records:
            if any(tp in ends and last >= ends[tp] for tp, last in spans):
                return offset
        return self.end


@dataclass(frozen=True)
class Search:
    """One read past a proposal for the missing events of its incomplete transactions."""

    regions: dict[str, dict[TP, tuple[int, int]]]
    """Per transaction, the ``[from, LSO)`` of each partition to read (:func:`search_regions`)."""
    expected: dict[str, int]
    """Per transaction, the events it declares for this pipeline's topics."""
    have: dict[str, frozenset[int]]
    """Per transaction, the positions of its events already known readable."""


def searches(spans: Iterable[TxnSpan], ends: Mapping[TP, int], lso: Mapping[TP, int],
             waits: Mapping[str, Wait]) -> tuple[Search, Search]:
    """The reads past the proposal that a scan's incomplete transactions need: first for those
    not waiting yet, then for those already waiting.

    Apart: a waiting transaction is searched from where its last search stopped, often far
    past the proposal, and one read of both would re-read the stretch in between.
    """
    incomplete = [s for s in spans if not s.complete]
    regions = search_regions(incomplete, ends, lso, waits)
    have = {s.txn: s.positions | (waits[s.txn].found if s.txn in waits else frozenset()) for s in incomplete}
    expected = {s.txn: s.expected for s in incomplete}

    def part(waited: bool) -> Search:
        mine = {txn: r for txn, r in regions.items() if (txn in waits) is waited}
        return Search(mine, {t: expected[t] for t in mine}, {t: have[t] for t in mine})
    return part(False), part(True)


@dataclass(frozen=True)
class Scanned:
    """The facts of a cut from the records: the planning scan's spans, and the search's finds."""

    spans: tuple[TxnSpan, ...]
    """Every multi-event source transaction with an event in the proposed ranges."""
    found: Mapping[str, frozenset[int]]
    """Per incomplete transaction, the positions of its events known readable past the proposal."""


@dataclass(frozen=True)
class Decision:
    """A batch's G3 plan, decided: the intent as the ledger will store it, and what to report of it."""

    intent: Intent
    held: tuple[str, ...]
    """Transactions left for a later batch (incomplete, or split by the cut)."""
    longest_wait: float
    """Seconds the longest-waiting released transaction waited (0 when none is released)."""


def decide(pipeline: str, policy: TransactionsConfig, intent: Intent, lso: Mapping[TP, int],
           waits: Mapping[str, Wait], facts: Scanned | ManifestRead) -> Decision:
    """``intent`` cut at source-transaction boundaries, from facts already gathered.

    ``lso``: per partition, the end up to which a missing event would be readable; ``waits``:
    the batch before's (:class:`offsets.ledger.Wait`), which this one carries on.

    1. Judge the transactions: whole in Kafka, waiting, or overdue (:func:`judge` from the
       scan's facts, :func:`listed_spans` from the manifest's).
    2. Apply the policy to the overdue: ``stop`` raises :class:`IncompleteTransactionError`
       (nothing is written), ``release`` takes them as they are.
    3. Cut the proposal so that every transaction with an event inside is whole or released
       (:func:`cut_with_inside`).
    4. Record the decisions in the intent: the ranges, the released, the waits carried on,
       and for a cut from the manifest, its offsets read and where the next read starts.
    """
    timeout = timedelta(seconds=policy.incomplete_timeout_seconds)
    # Step 1.
    inside: list[Listed] = []
    if isinstance(facts, Scanned):
        spans = list(facts.spans)
        verdict = judge(spans, facts.found, lso, waits, intent.planned_at, timeout)
        count = len(spans)
    else:
        spans, inside, verdict, count = listed_spans(facts.listed, intent.ranges, lso, waits, intent.planned_at,
                                                     timeout)
    # Step 2.
    late = verdict.overdue
    if late and policy.on_incomplete == "stop":
        names = ", ".join(f"{s.txn} ({s.seen} of {s.expected} events)" for s in late[:5])
        raise IncompleteTransactionError(
            f"pipeline {pipeline!r}: source transaction(s) missing events below the LSO for over "
            f"{policy.incomplete_timeout_seconds:g} s: {names}. Nothing of them was written. Find the missing "
            "events (relay, retention) or set transactions.on_incomplete: release to write them flagged")
    # Step 3.
    cut = cut_with_inside(intent.ranges, spans, inside, released=[s.txn for s in late])
    # Step 4.
    waiting = {txn: w for txn, w in verdict.waits.items() if txn not in cut.released}
    longest = 0.0
    if cut.released:
        longest = max((intent.planned_at - verdict.waits[s.txn].since).total_seconds() for s in late)
    cursor = intent.manifest  # a cut from the scan keeps whatever cursor the plan had
    if isinstance(facts, ManifestRead):
        cursor = (facts.start, facts.end, facts.next_cursor({r.tp: r.end for r in cut.ranges}))
    decided = replace(intent, guarded=isinstance(facts, ManifestRead), txns=count, ranges=cut.ranges,
                      released=cut.released, held=len(cut.held), waiting=waiting, manifest=cursor)
    return Decision(decided, cut.held, longest)
