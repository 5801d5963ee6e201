"""Step 2's growth (pure logic, no Spark): a batch grows to take one source transaction whole,
within a hard limit; past it, a wait stays a wait and sheer size is a clear error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest

from connectors.admin import PartitionBounds
from offsets.ledger import Intent, Wait, now_utc
from offsets.protocol import MAX_GROWTH, BatchLimitError, CommitProtocol

TPS = [("t", 0), ("t", 1)]
BOUNDS = {tp: PartitionBounds(0, 1_000_000) for tp in TPS}


class _Source:
    """The pipeline's side of a batch, reduced to step 2's decisions (the rest is never reached)."""

    keep_warm = False
    max_records = 100
    max_bytes = None

    def __init__(self, decide: Callable[..., Intent]) -> None:
        self.decide = decide
        self.revise: Callable[..., Intent] = decide

    def new_starts(self, *args: object) -> Mapping[Any, int]:
        raise AssertionError("not reached")

    sizes = frames = write_options = reached = new_starts


def _made(decide: Callable[..., Intent]) -> CommitProtocol:
    return CommitProtocol(None, _Source(decide), pipeline="p", target="/t", quarantine="/q",  # type: ignore[arg-type]
                          ledger="/l")


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

    return _made(decide)


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


def _thin(seen: list[int], keep: int = 5) -> CommitProtocol:
    """A protocol whose decide keeps a fifth of every range: a cut that falls back far."""

    def decide(intent: Intent, last: Intent | None, bounds: object) -> Intent:
        seen.append(sum(r.span for r in intent.ranges))
        return replace(intent, ranges=tuple(replace(r, end=r.start + r.span // keep) for r in intent.ranges))

    return _made(decide)


def test_a_thin_cut_grows_the_proposal_to_the_largest_cut_within_the_cap() -> None:
    seen: list[int] = []
    planned = _plan(_thin(seen), 100)
    # Cuts of 20, 40, then 80 offsets: at least half the cap.
    assert seen == [100, 200, 400] and sum(r.span for r in planned.ranges) == 80
    seen.clear()
    planned = _plan(_thin(seen, keep=3), 100)
    # Cuts of 32 and 66 offsets: 66 is past half the cap.
    assert seen == [100, 200] and sum(r.span for r in planned.ranges) == 66
    seen.clear()
    planned = _plan(_thin(seen, keep=3), 130)
    # Cuts of 42 then 86 offsets, and 86 fits the cap of 130.
    assert seen == [130, 260] and sum(r.span for r in planned.ranges) == 86


def test_fill_growth_stops_at_its_limit_and_never_passes_the_cap() -> None:
    seen: list[int] = []
    planned = _plan(_thin(seen, keep=40), 100)
    assert seen == [100, 200, 400, 800] and sum(r.span for r in planned.ranges) == 20


def test_fill_growth_keeps_the_last_cut_within_the_cap_when_a_larger_one_overshoots() -> None:
    """Transactions end at offsets 10 and 200 of each partition: the cuts are 20, 20, then 400."""
    seen: list[int] = []

    def decide(intent: Intent, last: Intent | None, bounds: object) -> Intent:
        seen.append(sum(r.span for r in intent.ranges))
        return replace(intent, ranges=tuple(replace(r, end=max(b for b in (0, 10, 200) if b <= r.end))
                                            for r in intent.ranges))

    protocol = _made(decide)
    planned = _plan(protocol, 100)
    assert seen == [100, 200, 400] and [r.end for r in planned.ranges] == [10, 10]


def test_a_revision_plans_again_from_the_starts_with_growth_not_within_the_guarded_ranges() -> None:
    """The guarded ranges were cut without the transaction that tripped the guard; it starts at
    the ranges' start and spans 1,500 offsets, so a cut within them leaves nothing. The revision
    proposes again from the same starts, grows until it fits, keeps the guarded intent's other
    decisions and drops its manifest cursor (the read it came from missed that transaction)."""
    from offsets.protocol import _Limits

    seen: list[int] = []
    protocol = _protocol(fits_at=1500, seen=seen)
    decided = protocol.source.decide

    def revise(proposal: Intent, last: Intent | None, bounds: object) -> Intent:
        assert proposal.dedup_version == 42 and not proposal.guarded and proposal.manifest is None
        return decided(proposal, last, bounds)

    protocol.source.revise = revise  # type: ignore[attr-defined]
    protocol._limits = _Limits(BOUNDS, 100)
    planned = _plan(protocol, 100)
    guarded = replace(planned, guarded=True, manifest=(0, 9, 9), dedup_version=42)
    seen.clear()
    revised = protocol._replanned(guarded)
    assert seen == [100, 400, 1600] and sum(r.span for r in revised.ranges) == 1600
    assert revised.dedup_version == 42 and revised.planned_at == guarded.planned_at and revised.manifest is None
    assert [r.start for r in revised.ranges] == [r.start for r in guarded.ranges]


def test_one_heartbeat_thread_says_a_long_write_runs_and_is_quiet_between_writes(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Step 4's heartbeat: a line per interval while a write runs, none once it ended, and one
    watcher thread for every write of the protocol (a follower writes several times a second)."""
    import logging
    import time

    from offsets import protocol

    monkeypatch.setattr(protocol, "HEARTBEAT_SECONDS", 0.05)
    beat = protocol._Heartbeat(object())  # type: ignore[arg-type]  # its progress is a courtesy: none here
    with caplog.at_level(logging.INFO, logger="offsets.protocol"):
        for n in range(20):  # quick writes: never reported
            with beat.watching(f"batch {n}"):
                pass
        first = beat._thread
        with beat.watching("batch 20"):
            time.sleep(0.3)
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("batch 20: its write has run for") for line in lines), lines
    assert first is not None and beat._thread is first and first.is_alive()
