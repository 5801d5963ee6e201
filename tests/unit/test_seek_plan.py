"""The seek's pure parts: where each partition moves, what it needs allowed, how the ledger keeps
it, and how the reconciliation counts the stretches a seek made the batches read twice or never."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from connectors.admin import PartitionBounds
from offsets.ledger import Intent, Move, Range, Seek, _intent
from pipelines.seek import Planned, SeekPlan, Target, check_allowed, parse_offsets, plan_moves
from quality.facts import coverage, skipped
from tidemark.errors import ConfigError

BOUNDS = {("t", 0): PartitionBounds(log_start=10, stable_end=100), ("t", 1): PartitionBounds(0, 50),
          ("u", 0): PartitionBounds(0, 5)}
ENDS = {("t", 0): 80, ("t", 1): 50}


def test_earliest_latest_shift_and_offsets_stay_inside_the_readable_log() -> None:
    scope = sorted(BOUNDS)
    assert {tp: m.new for tp, m in plan_moves(ENDS, BOUNDS, Target("earliest"), scope).items()} == {
        ("t", 0): 10, ("t", 1): 0, ("u", 0): 0}
    assert {tp: m.new for tp, m in plan_moves(ENDS, BOUNDS, Target("latest"), scope).items()} == {
        ("t", 0): 100, ("t", 1): 50, ("u", 0): 5}
    shifted = plan_moves(ENDS, BOUNDS, Target("shift", shift=-75), scope)
    assert {tp: m.new for tp, m in shifted.items()} == {("t", 0): 10, ("t", 1): 0, ("u", 0): 0}  # clamped
    assert shifted[("u", 0)].old is None  # never read: moves from nothing
    exact = plan_moves(ENDS, BOUNDS, Target("offsets", offsets={("t", 0): 42}), scope)
    assert list(exact.values()) == [Move("t", 0, 80, 42)]  # only the partitions named
    with pytest.raises(ConfigError, match=r"outside the partition's readable log \[10, 100\]"):
        plan_moves(ENDS, BOUNDS, Target("offsets", offsets={("t", 0): 5}), scope)


def test_a_partition_past_its_end_was_recreated_and_needs_no_flag() -> None:
    bounds = {("t", 0): PartitionBounds(0, 59)}
    moves = plan_moves({("t", 0): 466}, bounds, Target("earliest"), [("t", 0)])
    plan = SeekPlan("p", 9, Target("earliest"), tuple(Planned(m, bounds[tp]) for tp, m in moves.items()))
    check_allowed(plan, reprocess=False, skip=False)
    assert plan.planned[0].past_end and plan.reread == 0 and plan.skipped == 0
    assert "the topic was recreated" in plan.lines()[0]


def test_back_needs_reprocess_and_forward_needs_skip_each_counted() -> None:
    moves = plan_moves(ENDS, BOUNDS, Target("offsets", offsets={("t", 0): 30, ("t", 1): 20}), sorted(BOUNDS))
    plan = SeekPlan("p", 3, Target("offsets"), tuple(Planned(m, BOUNDS[tp]) for tp, m in moves.items()))
    with pytest.raises(ConfigError, match=r"2 partition\(s\) back: 80 offsets would be read again"):
        check_allowed(plan, reprocess=False, skip=True)
    check_allowed(plan, reprocess=True, skip=False)
    retention = {("t", 0): PartitionBounds(60, 100)}
    forward = plan_moves({("t", 0): 40}, retention, Target("earliest"), [("t", 0)])
    plan = SeekPlan("p", 3, Target("earliest"), tuple(Planned(m, retention[tp]) for tp, m in forward.items()))
    with pytest.raises(ConfigError, match="20 offsets would never be read"):
        check_allowed(plan, reprocess=True, skip=False)
    assert "20 of them deleted by retention" in plan.lines()[0]


def test_offsets_spec_is_parsed_or_refused_clearly() -> None:
    assert parse_offsets("orders:0=12, my:topic:1=7") == {("orders", 0): 12, ("my:topic", 1): 7}
    with pytest.raises(ConfigError, match="TOPIC:PARTITION=OFFSET"):
        parse_offsets("orders=12")


def test_a_seek_survives_the_ledger_row_round_trip() -> None:
    seek = Seek((Move("t", 0, 80, 30), Move("u", 0, None, 0)), "--to earliest")
    intent = Intent("p", 4, "w", datetime(2026, 1, 1, tzinfo=UTC), (Range("t", 0, 30, 30), Range("u", 0, 0, 0)),
                    seek=seek)
    row = dict(zip(("pipeline", "batch_id", "writer", "planned_at", "ranges", "decisions"), intent.row(), strict=True))
    row["ranges"] = [dict(zip(("topic", "partition", "start_offset", "end_offset"), r, strict=True))
                     for r in row["ranges"]]
    assert _intent(row) == intent
    assert seek.reread() == [Range("t", 0, 30, 80)] and seek.skipped() == []


def _batch(batch_id: int, *ranges: tuple[str, int, int, int], seek: Seek | None = None) -> Intent:
    return Intent("p", batch_id, "w", datetime(2026, 1, 1, tzinfo=UTC), tuple(Range(*r) for r in ranges), seek=seek)


def test_coverage_counts_each_offset_as_often_as_the_batches_read_it() -> None:
    intents = [
        _batch(1, ("t", 0, 0, 50)), _batch(2, ("t", 0, 50, 100)),
        _batch(3, ("t", 0, 20, 20), seek=Seek((Move("t", 0, 100, 20),), "--shift-by -80")),
        _batch(4, ("t", 0, 20, 120)),
        _batch(5, ("t", 0, 150, 150), seek=Seek((Move("t", 0, 120, 150),), "--shift-by 30")),
        _batch(6, ("t", 0, 150, 160)),
    ]
    assert coverage(intents) == {("t", 0): [(0, 20, 1), (20, 100, 2), (100, 120, 1), (120, 150, 0), (150, 160, 1)]}
    assert skipped(intents) == [(5, Range("t", 0, 120, 150), "--shift-by 30")]
    assert coverage([_batch(1, ("t", 0, 7, 7))]) == {}  # nothing read yet
