"""The G3 cut (offsets.cut): pure logic, checked against a brute-force definition."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from offsets.cut import TxnSpan, cut_ranges, overdue
from offsets.ledger import Range

T0 = datetime(2026, 11, 22, tzinfo=UTC)


def span(txn: str, events: dict[tuple[str, int], list[int]], expected: int | None = None,
         age: float = 0.0) -> TxnSpan:
    seen = sum(len(v) for v in events.values())
    return TxnSpan(txn, seen, expected if expected is not None else seen, T0 - timedelta(seconds=age),
                   {tp: (min(v), max(v)) for tp, v in events.items()})


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
    late = span("t1", {("a", 0): [3]}, expected=2, age=700)
    assert overdue([late], T0, timedelta(seconds=600)) == [late]
    assert overdue([late], T0, timedelta(seconds=800)) == []
    cut = cut_ranges(ranges, [late], released=["t1"])
    assert cut.ranges == tuple(ranges) and cut.released == ("t1",) and cut.held == ()


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
                visible.append(TxnSpan(s.txn, seen, s.expected, s.first_timestamp, kept))
        cut = cut_ranges(ranges, visible)
        ends = {r.tp: r.end for r in cut.ranges}
        assert _brute_force_ok(visible, ends)
        candidates = [sorted({ends0[tp]} | {s.offsets[tp][0] for s in visible if tp in s.offsets} | {0})
                      for tp in tps]
        valid = [dict(zip(tps, combo, strict=True)) for combo in itertools.product(*candidates)
                 if _brute_force_ok(visible, dict(zip(tps, combo, strict=True)))]
        best = {tp: max(v[tp] for v in valid) for tp in tps}
        assert ends == best, (ends, best, visible)
