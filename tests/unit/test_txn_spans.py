"""The planning scan's Arrow aggregation (pipelines.transactions.spans) against a plain-Python definition."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from pipelines.transactions import spans

T0 = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _events(rows: list[tuple[str, str, int, int, datetime, int, int]], tz: str) -> pa.Table:
    names = ["id", "topic", "partition", "offset", "timestamp", "position", "expected"]
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    types = [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.timestamp("us", tz=tz), pa.int32(), pa.int32()]
    return pa.table([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=names)


def test_no_events_no_spans() -> None:
    assert spans(_events([], "UTC")) == []


def test_spans_match_a_plain_definition_whatever_the_session_time_zone() -> None:
    rng = random.Random(7)
    rows = []
    for n in range(300):
        size = rng.randint(2, 6)
        for position in rng.sample(range(size), rng.randint(1, size)):
            topic, partition = rng.choice(["a", "b", "c"]), rng.randint(0, 2)
            copies = 2 if rng.random() < 0.1 else 1  # a duplicate is one event, seen once
            for _ in range(copies):
                rows.append((f"0/{n}", topic, partition, rng.randint(0, 10_000),
                             T0 + timedelta(seconds=rng.randint(0, 600)), position, size))
    expected = {}
    for txn in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == txn]
        offsets = {}
        for tp in {(r[1], r[2]) for r in mine}:
            at = [r[3] for r in mine if (r[1], r[2]) == tp]
            offsets[tp] = (min(at), max(at))
        expected[txn] = (len({r[5] for r in mine}), mine[0][6], min(r[4] for r in mine), offsets)
    for tz in ("UTC", "America/Los_Angeles"):
        got = {s.txn: (s.seen, s.expected, s.first_timestamp, dict(s.offsets)) for s in spans(_events(rows, tz))}
        assert got == expected
        assert all(s[2].utcoffset() == timedelta(0) for s in got.values())
