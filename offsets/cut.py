"""Where to cut a batch so every source transaction lands whole (G3): pure logic, no I/O.

The planner proposes ``[start, end)`` per partition. A source transaction (the events one
database transaction wrote, stamped by the relay) may have events in several partitions
and topics, and the proposed ends may fall between them: an LSO that has passed the
commit marker in one partition but not yet in another, a record cap, or a transaction
that will never be whole (events lost to retention, never produced). So:

1. A transaction is *whole* when the proposed ranges hold every event it declares for
   this pipeline's topics and all of them lie before the ends.
2. Every other transaction with an event before an end pulls that partition's end down
   to its first event there, in every partition it touches.
3. Cutting can split a transaction that was whole, so step 2 repeats until no end
   moves. Ends only decrease, so this stops; the result is the largest cut in which
   every transaction with an event inside is whole.

Exception: a transaction incomplete for longer than its timeout is *released*: taken as
it is (flagged in its rows) instead of holding its partitions back forever. Whether to
release is decided here, at planning, and the decision is stored with the batch's intent,
so a replay writes the same rows without asking the clock again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from offsets.ledger import TP, Range


@dataclass(frozen=True)
class TxnSpan:
    """What the proposed ranges hold of one multi-event source transaction."""

    txn: str
    seen: int
    """Distinct events of the transaction in the proposed ranges."""
    expected: int
    """Events it declares for this pipeline's topics."""
    first_timestamp: datetime
    """Kafka timestamp of its earliest event seen (aware)."""
    offsets: Mapping[TP, tuple[int, int]]
    """Per partition: (first, last) offset of its events there."""

    @property
    def complete(self) -> bool:
        return self.seen >= self.expected


@dataclass(frozen=True)
class Cut:
    ranges: tuple[Range, ...]
    released: tuple[str, ...]
    """Incomplete transactions taken as they are, past their timeout."""
    held: tuple[str, ...]
    """Transactions left for a later batch (incomplete, or split by the cut)."""


def overdue(spans: Iterable[TxnSpan], now: datetime, timeout: timedelta) -> list[TxnSpan]:
    """Incomplete transactions whose first event is older than ``timeout``."""
    return [s for s in spans if not s.complete and now - s.first_timestamp > timeout]


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
