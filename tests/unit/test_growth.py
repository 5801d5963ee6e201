"""Step 2's growth (pure logic, no Spark): a batch grows to take one source transaction whole,
within a hard limit; past it, a wait stays a wait and sheer size is a clear error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connectors.admin import PartitionBounds
from offsets.ledger import Intent, Wait, now_utc
from offsets.protocol import MAX_GROWTH, BatchLimitError, CommitProtocol

TPS = [("t", 0), ("t", 1)]
BOUNDS = {tp: PartitionBounds(0, 1_000_000) for tp in TPS}


def _protocol(fits_at: int | None, *, waiting: bool = False, seen: list[int] | None = None) -> CommitProtocol:
    """A protocol whose decide cuts every proposal to nothing below ``fits_at`` offsets per batch."""

    def decide(intent: Intent, last: Intent | None, bounds: object) -> Intent:
        span = sum(r.span for r in intent.ranges)
        if seen is not None:
            seen.append(span)
        if fits_at is not None and span >= fits_at:
            return intent
        cut = replace(intent, ranges=tuple(replace(r, end=r.start) for r in intent.ranges))
        return replace(cut, waiting={"7": Wait(now_utc(), {})}) if waiting else cut

    return CommitProtocol(None, pipeline="p", target="/t", quarantine="/q", ledger="/l",  # type: ignore[arg-type]
                          build_frames=lambda i: None, decide=decide)  # type: ignore[arg-type,return-value]


def _plan(protocol: CommitProtocol, cap: int) -> Intent:
    return protocol._plan(1, None, BOUNDS, {tp: 0 for tp in TPS}, cap)


def test_a_transaction_larger_than_the_cap_grows_the_batch_fourfold_until_it_fits() -> None:
    seen: list[int] = []
    planned = _plan(_protocol(fits_at=1500, seen=seen), 100)
    assert seen == [100, 400, 1600] and sum(r.span for r in planned.ranges) == 1600


def test_growth_stops_at_the_hard_limit_with_a_clear_error() -> None:
    seen: list[int] = []
    with pytest.raises(BatchLimitError, match=rf"{MAX_GROWTH}x max_records_per_batch.*Raise max_records_per_batch"):
        _plan(_protocol(fits_at=None, seen=seen), 100)
    assert seen == [100, 400, 1600, 6400] and max(seen) == 100 * MAX_GROWTH


def test_a_batch_held_back_by_a_wait_stays_empty_at_the_limit() -> None:
    planned = _plan(_protocol(fits_at=None, waiting=True), 100)
    assert planned.is_empty and planned.waiting
