"""The planning scan's Arrow aggregation (pipelines.transactions.scanning.spans) against a plain-Python definition."""

from __future__ import annotations

import random

import pyarrow as pa

from pipelines.transactions.scanning import spans


def _events(rows: list[tuple[str, str, int, int, int, int]]) -> pa.Table:
    names = ["id", "topic", "partition", "offset", "position", "expected"]
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    types = [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.int32(), pa.int32()]
    return pa.table([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=names)


def test_no_events_no_spans() -> None:
    assert spans(_events([])) == []


def test_spans_match_a_plain_definition() -> None:
    rng = random.Random(7)
    rows = []
    declared = {}
    for n in range(300):
        size = rng.randint(2, 6)
        declared[f"0/{n}"] = {"a": size} if n % 3 else None
        for position in rng.sample(range(size), rng.randint(1, size)):
            topic, partition = rng.choice(["a", "b", "c"]), rng.randint(0, 2)
            copies = 2 if rng.random() < 0.1 else 1  # a duplicate is one event, seen once
            for _ in range(copies):
                rows.append((f"0/{n}", topic, partition, rng.randint(0, 10_000), position, size))
    expected = {}
    for txn in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == txn]
        offsets = {}
        for tp in {(r[1], r[2]) for r in mine}:
            at = [r[3] for r in mine if (r[1], r[2]) == tp]
            offsets[tp] = (min(at), max(at))
        positions = {r[4] for r in mine}
        by_topic = {t: len({r[4] for r in mine if r[1] == t}) for t in {r[1] for r in mine}}
        complete = len(positions) >= mine[0][5]
        expected[txn] = (len(positions), mine[0][5], offsets, declared[txn], by_topic,
                         frozenset() if complete else frozenset(positions))
    got = {s.txn: (s.seen, s.expected, dict(s.offsets), s.declared, dict(s.seen_by_topic), s.positions)
           for s in spans(_events(rows), declared)}
    assert got == expected
    assert any(v[5] for v in got.values()) and any(not v[5] for v in got.values())
