"""The G3 cut and the search for missing events (offsets.cut): pure logic, checked against
brute-force and plain definitions."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from offsets.cut import TxnSpan, cut_ranges, judge, search_regions
from offsets.ledger import Intent, Range, Wait
from tidemark.config import TransactionsConfig

T0 = datetime(2026, 11, 22, tzinfo=UTC)
TIMEOUT = timedelta(seconds=600)


def span(txn: str, events: dict[tuple[str, int], list[int]], expected: int | None = None,
         declared: dict[str, int] | None = None, positions: set[int] | None = None) -> TxnSpan:
    seen = sum(len(v) for v in events.values())
    by_topic: dict[str, int] = {}
    for (topic, _), offsets in events.items():
        by_topic[topic] = by_topic.get(topic, 0) + len(offsets)
    return TxnSpan(txn, seen, expected if expected is not None else seen,
                   {tp: (min(v), max(v)) for tp, v in events.items()}, declared=declared,
                   seen_by_topic=by_topic, positions=frozenset(positions if positions is not None else range(seen)))


def test_whole_transactions_leave_the_ranges_alone() -> None:
    ranges = [Range("a", 0, 0, 10), Range("b", 0, 0, 10)]
    cut = cut_ranges(ranges, [span("t1", {("a", 0): [2, 3], ("b", 0): [5]})])
    assert cut.ranges == tuple(ranges) and cut.held == () and cut.released == ()


def test_incomplete_transaction_cuts_every_partition_it_touches() -> None:
    ranges = [Range("a", 0, 0, 10), Range("b", 0, 0, 10), Range("c", 0, 0, 10)]
    # Declares 3 events here, 2 are visible (the third is past c's LSO).
    cut = cut_ranges(ranges, [span("t1", {("a", 0): [4], ("b", 0): [7]}, expected=3)])
    assert cut.ranges == (Range("a", 0, 0, 4), Range("b", 0, 0, 7), Range("c", 0, 0, 10))
    assert cut.held == ("t1",)


def test_cut_cascades_to_transactions_it_splits() -> None:
    ranges = [Range("a", 0, 0, 10), Range("b", 0, 0, 10)]
    spans = [
        span("t1", {("a", 0): [8]}, expected=2),           # incomplete: a ends at 8
        span("t2", {("a", 0): [9], ("b", 0): [1]}),        # whole, but its a-event is now cut off
        span("t3", {("b", 0): [0]} | {("a", 0): [2]}),     # whole and before both cuts
    ]
    cut = cut_ranges(ranges, spans)
    assert cut.ranges == (Range("a", 0, 0, 8), Range("b", 0, 0, 1))
    assert cut.held == ("t1", "t2")


def test_released_transactions_are_taken_as_they_are() -> None:
    ranges = [Range("a", 0, 0, 10)]
    cut = cut_ranges(ranges, [span("t1", {("a", 0): [3]}, expected=2)], released=["t1"])
    assert cut.ranges == tuple(ranges) and cut.released == ("t1",) and cut.held == ()


LSO = {("a", 0): 100, ("a", 1): 80, ("b", 0): 50}


def test_the_search_looks_only_where_missing_events_can_be() -> None:
    ends = {("a", 0): 10, ("a", 1): 80, ("b", 0): 20}
    # Its a-events are all here; b owes one: only b's partitions are searched, from the proposal's end.
    owing_b = span("t1", {("a", 0): [3], ("b", 0): [4]}, expected=3, declared={"a": 1, "b": 2})
    # No per-topic counts: any partition with something past the proposal (a[1] is at its LSO).
    unknown = span("t2", {("a", 0): [5]}, expected=2)
    # Waiting already: searched on from where the last search stopped, not from the proposal.
    waited = span("t3", {("a", 0): [6]}, expected=2, declared={"a": 2})
    waits = {"t3": Wait(T0, {("a", 0): 60, ("a", 1): 80})}
    regions = search_regions([owing_b, unknown, waited], ends, LSO, waits)
    assert regions == {"t1": {("b", 0): (20, 50)}, "t2": {("a", 0): (10, 100), ("b", 0): (20, 50)},
                       "t3": {("a", 0): (60, 100)}}


def test_a_transaction_whole_past_the_proposal_waits_without_a_clock() -> None:
    """A cap that splits a transaction must never release it, however old: its rest lies readable past the cap."""
    split = span("t1", {("a", 0): [8, 9]}, expected=3, positions={0, 1})
    verdict = judge([split], {"t1": frozenset({2})}, LSO, {}, T0 + timedelta(days=1), TIMEOUT)
    assert verdict.whole_in_kafka == ("t1",) and verdict.waits == {} and verdict.overdue == ()
    # And the cut holds it for a later batch rather than writing part of it.
    assert cut_ranges([Range("a", 0, 0, 10)], [split]).ranges == (Range("a", 0, 0, 8),)


def test_the_wait_counts_from_the_first_batch_that_saw_events_missing_below_the_lso() -> None:
    missing = span("t1", {("a", 0): [8]}, expected=2, declared={"a": 1, "b": 1}, positions={0})
    first = judge([missing], {}, LSO, {}, T0, TIMEOUT)
    assert first.overdue == () and first.waits == {"t1": Wait(T0, {("b", 0): 50}, frozenset({0}))}
    # Later batches keep the first sighting and search on from the LSO then.
    later = judge([missing], {}, {**LSO, ("b", 0): 70}, first.waits, T0 + TIMEOUT - timedelta(seconds=1), TIMEOUT)
    assert later.overdue == () and later.waits["t1"].since == T0 and later.waits["t1"].searched == {("b", 0): 70}
    due = judge([missing], {}, LSO, later.waits, T0 + TIMEOUT, TIMEOUT)
    assert due.overdue == (missing,)
    # The missing event turns up: whole in Kafka, no longer waiting, never released.
    found = judge([missing], {"t1": frozenset({1})}, LSO, later.waits, T0 + 2 * TIMEOUT, TIMEOUT)
    assert found.whole_in_kafka == ("t1",) and found.waits == {} and found.overdue == ()


def test_events_found_by_earlier_searches_still_count() -> None:
    # Three events: one in the proposal, one found by an earlier batch's search, one found now.
    t = span("t1", {("a", 0): [8]}, expected=3, positions={0})
    waits = {"t1": Wait(T0, {("a", 0): 90}, frozenset({0, 2}))}
    assert judge([t], {"t1": frozenset({1})}, LSO, waits, T0, TIMEOUT).whole_in_kafka == ("t1",)


def test_waits_of_transactions_this_batch_did_not_see_are_carried() -> None:
    waits = {"gone-for-now": Wait(T0, {("a", 0): 30})}
    assert judge([span("t2", {("a", 0): [1, 2]})], {}, LSO, waits, T0, TIMEOUT).waits == waits


def _brute_force_ok(spans: list[TxnSpan], ends: dict[tuple[str, int], int]) -> bool:
    """Every transaction with an event inside ``ends`` is complete and wholly inside."""
    for s in spans:
        inside = [first < ends[tp] for tp, (first, _) in s.offsets.items()]
        if any(inside) and not (s.complete and all(last < ends[tp] for tp, (_, last) in s.offsets.items())):
            return False
    return True


def test_random_cuts_are_valid_and_the_largest_valid_cut() -> None:
    """Valid cuts are closed under pointwise max, so a largest one exists; brute force finds it."""
    import itertools

    rng = random.Random(3)
    for _ in range(200):
        tps = [("t", p) for p in range(rng.randint(1, 3))]
        cursor = {tp: 0 for tp in tps}
        spans: list[TxnSpan] = []
        for i in range(rng.randint(1, 8)):
            events = {}
            for tp in rng.sample(tps, rng.randint(1, len(tps))):
                n = rng.randint(1, 3)
                events[tp] = list(range(cursor[tp], cursor[tp] + n))
                cursor[tp] += n + rng.randint(0, 2)
            missing = 1 if rng.random() < 0.2 else 0
            spans.append(span(f"x{i}", events, expected=sum(map(len, events.values())) + missing))
        ends0 = {tp: max(0, cursor[tp] + rng.randint(0, 2) - rng.randint(0, 4)) for tp in tps}
        ranges = [Range(t, p, 0, ends0[(t, p)]) for t, p in tps]
        # The scan only sees events before the proposed ends (contiguous offsets per partition here).
        visible = []
        for s in spans:
            kept = {tp: (o[0], min(o[1], ends0[tp] - 1)) for tp, o in s.offsets.items() if o[0] < ends0[tp]}
            if kept:
                seen = sum(last - first + 1 for first, last in kept.values())
                visible.append(TxnSpan(s.txn, seen, s.expected, kept))
        cut = cut_ranges(ranges, visible)
        ends = {r.tp: r.end for r in cut.ranges}
        assert _brute_force_ok(visible, ends)
        candidates = [sorted({ends0[tp]} | {s.offsets[tp][0] for s in visible if tp in s.offsets} | {0})
                      for tp in tps]
        valid = [dict(zip(tps, combo, strict=True)) for combo in itertools.product(*candidates)
                 if _brute_force_ok(visible, dict(zip(tps, combo, strict=True)))]
        best = {tp: max(v[tp] for v in valid) for tp in tps}
        assert ends == best, (ends, best, visible)


def _relay_like(rng: random.Random) -> tuple[list[tuple[str, int]], dict[str, dict[tuple[str, int], list[int]]],
                                             dict[tuple[str, int], int]]:
    """Random relay-like partitions: each transaction's events a gap-free run per partition;
    returns the partitions, each transaction's offsets per partition, and the LSOs."""
    tps = [("a", 0), ("a", 1), ("b", 0)]
    cursor = {tp: 0 for tp in tps}
    events: dict[str, dict[tuple[str, int], list[int]]] = {}
    for i in range(rng.randint(1, 10)):
        txn = events.setdefault(f"t{i}", {})
        for tp in rng.sample(tps, rng.randint(1, 3)):
            n = rng.randint(1, 3)
            txn[tp] = list(range(cursor[tp], cursor[tp] + n))
            cursor[tp] += n + (1 if rng.random() < 0.5 else 0)  # a commit marker, sometimes
    return tps, events, dict(cursor)


def test_the_manifest_and_the_scan_give_the_same_cut() -> None:
    """Random relay-like partitions: each transaction's events are a gap-free run per partition.
    The scan sees the events inside the proposal; the manifest lists every span. Same cut, same
    held transactions, same 'whole in Kafka' verdicts."""
    from offsets.cut import ListedTxn, cut_with_inside, listed_spans

    rng = random.Random(5)
    for _ in range(300):
        tps, events, lso = _relay_like(rng)
        ranges = [Range(t, p, 0, max(0, lso[(t, p)] - rng.randint(0, 4))) for t, p in tps]
        ends = {r.tp: r.end for r in ranges}
        scanned = []
        for txn, where in events.items():
            inside = {tp: [o for o in offs if o < ends[tp]] for tp, offs in where.items()}
            inside = {tp: offs for tp, offs in inside.items() if offs}
            total = sum(len(o) for o in where.values())
            if inside and total > 1:
                scanned.append(TxnSpan(txn, sum(len(o) for o in inside.values()), total,
                                       {tp: (min(o), max(o)) for tp, o in inside.items()}))
        listed = [ListedTxn(txn, tuple((tp, min(o), max(o), len(o)) for tp, o in where.items()))
                  for txn, where in events.items()]
        from_manifest, inside, verdict, count = listed_spans(listed, ranges, lso, {}, T0, TIMEOUT)
        assert cut_with_inside(ranges, from_manifest, inside) == cut_ranges(ranges, scanned)
        assert count == len(scanned)
        # Everything is below the LSO here: what is not whole in the batch is whole in Kafka.
        assert verdict.waits == {} and set(verdict.whole_in_kafka) == {s.txn for s in scanned if not s.complete}


def test_a_listed_transaction_missing_events_before_the_start_waits_then_is_overdue() -> None:
    from offsets.cut import ListedTxn, listed_spans

    ranges = [Range("a", 0, 10, 20), Range("a", 1, 5, 9)]
    lso = {("a", 0): 20, ("a", 1): 9}
    # Its a[1] event lies before the pipeline's start there (the pipeline began after it).
    early = ListedTxn("t1", ((("a", 0), 12, 12, 1), (("a", 1), 3, 3, 1)))
    spans, _, first, _ = listed_spans([early], ranges, lso, {}, T0, TIMEOUT)
    assert first.waits["t1"].since == T0 and first.overdue == ()
    assert cut_ranges(ranges, spans).ranges == (Range("a", 0, 10, 12), Range("a", 1, 5, 9))
    _, _, later, _ = listed_spans([early], ranges, lso, first.waits, T0 + TIMEOUT, TIMEOUT)
    assert [s.txn for s in later.overdue] == ["t1"]


class _Record:
    """A manifest record as confluent-kafka hands it over: its value and headers."""

    def __init__(self, encoded: tuple[bytes, bytes] | bytes) -> None:
        self._value, self._headers = ((encoded[0], [("tidemark.manifest.summary", encoded[1])])
                                      if isinstance(encoded, tuple) else (encoded, None))

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


@pytest.mark.parametrize("summary", [True, False], ids=["with-summary", "record-only"])
@pytest.mark.parametrize("other_topic", [True, False], ids=["other-topic", "ours-only"])
def test_manifest_records_read_as_blocks_give_the_scans_cut_and_guard_range(summary: bool, other_topic: bool) -> None:
    """Relay-like data encoded as real manifest records (random group commits, a topic of
    another pipeline mixed in or not): what ``pipelines.transactions.manifest_records.read_record`` makes of
    each record (blocks where a record lies inside the proposal, from its summary header
    when it has one, else from its entries) cuts exactly as the scan of the records does,
    counts the same transactions, and lists the same LSN range for the guard."""
    from offsets.cut import ListedBlock, cut_with_inside, listed_spans
    from outbox.wire import Manifest, ManifestEntry, decode_record
    from pipelines.transactions.manifest_records import (
        _summarized,
        _take,
        proposal_limits,
        read_record,
        relay_ranges,
    )

    rng = random.Random(11)
    ours = [("a", 0), ("a", 1), ("b", 0)]
    blocks = reached = quick = 0
    for _ in range(300):
        tps = [*ours, ("z", 0)] if other_topic else ours  # z: a topic this pipeline does not read
        cursor = {tp: 0 for tp in tps}
        events: dict[str, dict[tuple[str, int], list[int]]] = {}
        for i in range(rng.randint(1, 30)):
            txn = events.setdefault(f"0/{i + 1:X}/{i}", {})  # <commit LSN>/<xid>
            for tp in rng.sample(tps, rng.randint(1, 3)):
                n = rng.randint(1, 3)
                txn[tp] = list(range(cursor[tp], cursor[tp] + n))
                cursor[tp] += n + (1 if rng.random() < 0.3 else 0)
        lso = {tp: cursor[tp] for tp in ours}
        ranges = [Range(t, p, 0, max(0, lso[(t, p)] - rng.choice([0, 0, 1, 5, 20]))) for t, p in ours]
        intent = Intent("p", 7, "w", T0, tuple(ranges))
        ends, starts = {r.tp: r.end for r in ranges}, {r.tp: 0 for r in ranges}
        names = list(events)
        records, i = [], 0
        while i < len(names):
            group = names[i:i + rng.randint(1, 8)]
            i += len(group)
            records.append(Manifest("r1", "0/0", tuple(
                ManifestEntry(txn, sum(len(o) for o in events[txn].values()),
                              tuple((t, p, min(o), max(o), len(o)) for (t, p), o in events[txn].items()))
                for txn in group)))
        listed, by_relay = [], {}
        for manifest in records:
            record = _Record(manifest.encoded() if summary else manifest.encode())
            relay, found, ids, _ = read_record(record, proposal_limits(intent), lambda t: t != "z", starts, ends)
            from_summary = _summarized(record, proposal_limits(intent), lambda t: t != "z")
            if from_summary is not None:  # then exactly the block the entries give
                quick += 1
                decoded = decode_record(manifest.encode())
                assert decoded is not None
                (block,), block_ids, _ = _take(decoded[1], proposal_limits(intent), lambda t: t != "z", starts, ends)
                assert isinstance(block, ListedBlock)
                assert (dict(from_summary[1].last), from_summary[1].txns, from_summary[2]) == \
                    (dict(block.last), block.txns, block_ids)
                assert from_summary[1].expand() == block.expand()
            listed += found
            by_relay.setdefault(relay, []).extend(ids)
        scanned = []
        for txn, where in events.items():
            mine = {tp: o for tp, o in where.items() if tp in lso}
            inside = {tp: [o for o in offs if o < ends[tp]] for tp, offs in mine.items()}
            inside = {tp: offs for tp, offs in inside.items() if offs}
            total = sum(len(o) for o in mine.values())
            if inside and total > 1:
                scanned.append(TxnSpan(txn, sum(len(o) for o in inside.values()), total,
                                       {tp: (min(o), max(o)) for tp, o in inside.items()}))
        spans, inside_whole, _, count = listed_spans(listed, ranges, lso, {}, T0, TIMEOUT)
        cut = cut_with_inside(ranges, spans, inside_whole)
        assert cut == cut_ranges(ranges, scanned)
        assert count == len(scanned)
        found_blocks = [b for b in listed if isinstance(b, ListedBlock)]
        blocks += len(found_blocks)
        reached += sum(b.reached({r.tp: r.end for r in cut.ranges}) for b in found_blocks)
        touched = [int(t.split("/")[1], 16) for t, where in events.items()
                   if any(tp in lso and min(o) < ends[tp] for tp, o in where.items())]
        assert relay_ranges(by_relay) == ((("r1", min(touched), max(touched)),) if touched else ())
    assert blocks > 100 and reached > 10, (blocks, reached)  # both paths of the block were taken
    # The summary answered for many records (those inside the proposal holding only this
    # pipeline's topics); without it, none.
    assert (quick > 80) if summary else quick == 0, quick


def _policy(on_incomplete: str = "release") -> TransactionsConfig:
    return TransactionsConfig.model_validate({"on_incomplete": on_incomplete,
                                              "incomplete_timeout_seconds": TIMEOUT.total_seconds()})


def test_one_decision_from_the_scans_facts_or_the_manifests_gives_one_intent() -> None:
    """Random relay-like partitions, every event below the LSO: ``decide`` from the scan's
    spans and search, and from the manifest's listing, gives the same ranges, holds, waits and
    count; only the manifest's makes the write guarded and moves the manifest cursor."""
    from offsets.cut import ListedTxn, ManifestRead, Scanned, decide

    rng = random.Random(23)
    for _ in range(200):
        tps, events, lso = _relay_like(rng)
        ranges = tuple(Range(t, p, 0, max(0, lso[(t, p)] - rng.randint(0, 4))) for t, p in tps)
        ends = {r.tp: r.end for r in ranges}
        intent = Intent("p", 7, "w", T0, ranges, manifest=(0, 3, 3))
        spans, found = [], {}
        for txn, where in events.items():
            inside = {tp: [o for o in offs if o < ends[tp]] for tp, offs in where.items()}
            inside = {tp: offs for tp, offs in inside.items() if offs}
            total, seen = sum(len(o) for o in where.values()), sum(len(o) for o in inside.values())
            if inside and total > 1:
                spans.append(TxnSpan(txn, seen, total, {tp: (min(o), max(o)) for tp, o in inside.items()},
                                     positions=frozenset(range(seen))))
                if seen < total:  # the search meets the rest past the proposal
                    found[txn] = frozenset(range(seen, total))
        listed = tuple(ListedTxn(txn, tuple((tp, min(o), max(o), len(o)) for tp, o in where.items()))
                       for txn, where in events.items())
        lasts = tuple((3 + i, tuple((tp, max(o)) for tp, o in where.items()))
                      for i, where in enumerate(events.values()))
        read = ManifestRead(3, 3 + len(lasts), listed, (), lasts)
        scanned = decide("p", _policy(), intent, lso, {}, Scanned(tuple(spans), found))
        listed_cut = decide("p", _policy(), intent, lso, {}, read)
        assert scanned.intent.ranges == listed_cut.intent.ranges == cut_ranges(ranges, spans).ranges
        assert scanned.held == listed_cut.held and scanned.intent.held == len(scanned.held)
        assert scanned.intent.txns == listed_cut.intent.txns == len(spans)
        assert scanned.intent.waiting == listed_cut.intent.waiting == {}
        assert not scanned.intent.guarded and scanned.intent.manifest == (0, 3, 3)
        assert listed_cut.intent.guarded
        assert listed_cut.intent.manifest == (3, read.end, read.next_cursor(listed_cut.intent.ends()))


def test_one_decision_refuses_an_overdue_transaction_under_stop_and_releases_it_flagged_otherwise() -> None:
    from offsets.cut import IncompleteTransactionError, Scanned, decide

    ranges = (Range("a", 0, 0, 10), Range("b", 0, 0, 10))
    lso = {("a", 0): 10, ("b", 0): 10}
    torn = span("t1", {("a", 0): [4]}, expected=2, declared={"a": 1, "b": 1})
    whole = span("t2", {("a", 0): [1], ("b", 0): [2]})
    waits = {"t1": Wait(T0, {("b", 0): 10})}
    facts = Scanned((torn, whole), {})
    # Not yet overdue: the torn one is held and keeps waiting since T0.
    young = decide("p", _policy("stop"), Intent("p", 2, "w", T0 + TIMEOUT / 2, ranges), lso, waits, facts)
    assert young.intent.ranges == (Range("a", 0, 0, 4), Range("b", 0, 0, 10)) and young.held == ("t1",)
    assert young.intent.waiting["t1"].since == T0 and young.intent.released == () and young.longest_wait == 0
    late = Intent("p", 3, "w", T0 + TIMEOUT, ranges)
    with pytest.raises(IncompleteTransactionError, match="t1"):
        decide("p", _policy("stop"), late, lso, waits, facts)
    released = decide("p", _policy("release"), late, lso, waits, facts)
    assert released.intent.ranges == ranges and released.intent.released == ("t1",) and released.held == ()
    assert released.intent.waiting == {} and released.longest_wait == TIMEOUT.total_seconds()


def test_the_search_reads_apart_for_new_and_for_waiting_transactions() -> None:
    """What the scan's incomplete transactions need read past the proposal: a waiting one from
    where its last search stopped, in a read of its own, knowing what that search found."""
    from offsets.cut import searches

    ends, lso = {("a", 0): 10, ("b", 0): 20}, {("a", 0): 100, ("b", 0): 50}
    new = span("t1", {("a", 0): [8]}, expected=2, declared={"a": 1, "b": 1})
    waiting = span("t2", {("a", 0): [9]}, expected=3, declared={"a": 3})
    whole = span("t3", {("a", 0): [1], ("b", 0): [2]})
    waits = {"t2": Wait(T0, {("a", 0): 60}, found=frozenset({2}))}
    first, then = searches([new, waiting, whole], ends, lso, waits)
    assert first.regions == {"t1": {("b", 0): (20, 50)}} and first.expected == {"t1": 2}
    assert first.have == {"t1": frozenset({0})}
    assert then.regions == {"t2": {("a", 0): (60, 100)}} and then.expected == {"t2": 3}
    assert then.have == {"t2": frozenset({0, 2})}


def test_a_manifest_read_stops_only_once_every_relay_met_passed_every_partition_read() -> None:
    """A capped proposal over partitions filling at different rates: records entirely past one
    partition's end come before a record inside another's, so no count of records past the
    ends may stop the read; only every partition passed, by every relay met, does."""
    from offsets.ledger import Intent, Range, now_utc
    from pipelines.transactions.manifest_records import Frontier

    fast, slow, idle = ("order", 0), ("shipment", 0), ("payment", 0)
    intent = Intent("p", 2, "w", now_utc(), (Range(*fast, 100, 110), Range(*slow, 5, 8), Range(*idle, 7, 7)))
    frontier = Frontier(intent)
    frontier.see("r1", ((fast, 120),))
    frontier.see("r1", ((fast, 130),))
    assert not frontier.reached()  # a later record of r1 may still list shipment 5-7
    frontier.see("r1", ((fast, 140), (slow, 6)))
    assert not frontier.reached()
    frontier.see("r1", ((slow, 8),))
    assert frontier.reached()  # the empty payment range needs no passing
    frontier.see("r2", ((fast, 150),))
    assert not frontier.reached()  # r2's records follow its own events, not r1's
    frontier.see("r2", ((slow, 9), (fast, 151)))
    assert frontier.reached()
