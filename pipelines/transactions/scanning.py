"""The facts of a batch's cut where the manifest does not give them: read from the records.

A batch whose transactions no manifest lists can only be cut from what its own records
say. Reading them costs what the batch's write costs if done by Spark's reader (it
copies every value), so they are read here by librdkafka on the driver, headers only
(``connectors.range_reader``): once over the proposal (:func:`scan`), then, for the
transactions it holds only part of, past it up to the LSOs (:func:`search`), where
:func:`offsets.cut.searches` says to look. The first records of a batch's ranges are read the
same way to guess whether a batch needs a scan at all (:func:`probe`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

from offsets.cut import TxnSpan
from offsets.ledger import TP, Intent
from pipelines.transactions.headers import Shared, declared, topic_filter, txn_of
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    import pyarrow as pa


def scan(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> list[TxnSpan]:
    """Every multi-event source transaction with an event in ``intent``'s ranges.

    Read by librdkafka on the driver, headers only (``connectors.range_reader``): Spark's
    reader would copy every value, and cost about what the batch's write costs. The
    events of multi-event transactions are gathered in Arrow chunks and aggregated there.
    """
    import pyarrow as pa

    schema = pa.schema([("id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                        ("offset", pa.int64()), ("position", pa.int32()), ("expected", pa.int32())])
    rows: list[tuple[Any, ...]] = []
    chunks: list[pa.RecordBatch] = []

    def chunk() -> None:
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        chunks.append(pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema))
        rows.clear()

    ranges = [(r.topic, r.partition, r.start, r.end) for r in intent.ranges]
    memo: dict[tuple[bytes | None, ...], Shared | None] = {}
    for row in _multi_event(client_config, pipeline, ranges, memo=memo):
        rows.append(row)
        if len(rows) >= 100_000:
            chunk()
    chunk()
    return spans(pa.Table.from_batches(chunks, schema=schema), declared(memo))


def _multi_event(client_config: Mapping[str, str], pipeline: PipelineConfig, ranges: list[tuple[str, int, int, int]],
                 *, small: bool = False, memo: dict[tuple[bytes | None, ...], Shared | None] | None = None,
                 ) -> Generator[tuple[str, str, int, int, int, int], None, None]:
    """(id, topic, partition, offset, position, expected) of each event of a multi-event
    transaction in ``ranges``: the records :func:`scan` keeps and
    :func:`~pipelines.transactions.headers.guard` flags."""
    from connectors.range_reader import headed_records

    mine = topic_filter(pipeline)
    memo = {} if memo is None else memo
    for topic, partition, offset, _, headers in headed_records(client_config, ranges, small=small):
        txn = txn_of(headers, mine, memo)
        if txn is not None and txn[2] > 1:
            yield txn[0], topic, partition, offset, txn[1], txn[2]


def spans(events: pa.Table, declared: Mapping[str, Mapping[str, int] | None] | None = None) -> list[TxnSpan]:
    """One :class:`~offsets.cut.TxnSpan` per ``id`` of ``events``
    (id, topic, partition, offset, position, expected).

    ``declared``: per id, the events it declares per topic of the pipeline (None: unknown).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if events.num_rows == 0:
        return []
    declared = declared or {}
    ranges = events.group_by(["id", "topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
    offsets: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
    for txn, topic, partition, first, last in zip(*(ranges[c].to_pylist() for c in (
            "id", "topic", "partition", "offset_min", "offset_max")), strict=True):
        offsets.setdefault(txn, {})[(topic, int(partition))] = (int(first), int(last))
    by_topic: dict[str, dict[str, int]] = {}
    per_topic = events.group_by(["id", "topic"]).aggregate([("position", "count_distinct")])
    for txn, topic, n in zip(*(per_topic[c].to_pylist() for c in ("id", "topic", "position_count_distinct")),
                             strict=True):
        by_topic.setdefault(txn, {})[topic] = int(n)
    per_txn = events.group_by("id").aggregate([("position", "count_distinct"), ("expected", "max")])
    ids, seen, expected = (per_txn[c].to_pylist() for c in ("id", "position_count_distinct", "expected_max"))
    # The positions of incomplete transactions only: the search past the proposal adds to them.
    short = [txn for txn, s, e in zip(ids, seen, expected, strict=True) if s < e]
    positions: dict[str, frozenset[int]] = {}
    if short:
        mine = events.filter(pc.is_in(events["id"], value_set=pa.array(short, pa.string())))
        for txn, at in zip(*(mine.group_by("id").aggregate([("position", "distinct")])[c].to_pylist()
                             for c in ("id", "position_distinct")), strict=True):
            positions[txn] = frozenset(int(p) for p in at)
    return [
        TxnSpan(txn=txn, seen=int(s), expected=int(e), offsets=offsets[txn], declared=declared.get(txn),
                seen_by_topic=by_topic[txn], positions=positions.get(txn, frozenset()))
        for txn, s, e in zip(ids, seen, expected, strict=True)
    ]


def search(client_config: Mapping[str, str], pipeline: PipelineConfig, regions: Mapping[str, Mapping[TP, tuple[int, int]]],
           expected: Mapping[str, int], have: Mapping[str, frozenset[int]]) -> dict[str, frozenset[int]]:
    """Positions of each transaction's events known readable: ``have``, and those met in its ``regions``
    (past the proposal, below the LSO).

    Reading stops in a partition as soon as every transaction looking there is whole
    (``have`` plus what was met reaches ``expected``): the rest of a transaction the cap
    split usually lies just past the proposal, so this costs a fetch or two. Only a
    transaction missing events for real is searched to the LSO; a later batch searches
    it only from where this stopped (:func:`offsets.cut.search_regions`).
    """
    from connectors.range_reader import RangeReader

    found: dict[str, set[int]] = {txn: set(have.get(txn, ())) for txn in regions}
    span: dict[TP, tuple[int, int]] = {}
    looking: dict[TP, set[str]] = {}
    for txn, parts in regions.items():
        for tp, (start, end) in parts.items():
            lo, hi = span.get(tp, (start, end))
            span[tp] = (min(lo, start), max(hi, end))
            looking.setdefault(tp, set()).add(txn)
    if not span:
        return {}
    mine = topic_filter(pipeline)
    memo: dict[tuple[bytes | None, ...], Shared | None] = {}
    with RangeReader(client_config, [(t, p, lo, hi) for (t, p), (lo, hi) in span.items()],
                     fetch_bytes=16 * 1024 * 1024, partition_fetch_bytes=1024 * 1024) as reader:
        for m in reader.records():
            headers = m.headers()
            event = txn_of(headers, mine, memo) if headers else None
            if event is None or event[0] not in found:
                continue
            got = found[event[0]]
            if event[1] in got:
                continue
            got.add(event[1])
            if len(got) < expected[event[0]]:
                continue
            for tp in regions[event[0]]:  # whole: no partition needs reading for it any more
                waiting = looking[tp]
                waiting.discard(event[0])
                if not waiting and tp in reader.pending:
                    reader.finish(tp)
    return {txn: frozenset(p) for txn, p in found.items()}


#: Records :func:`probe` reads from the start of each range.
PROBE_RECORDS = 64


def probe(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> bool:
    """Does the start of any of ``intent``'s ranges hold an event of a multi-event transaction?

    Only a guess for :class:`pipelines.ingest.IngestJob` (a guarded write checks every
    record); relay topics with multi-event transactions show them in the first records.
    """
    ranges = [(r.topic, r.partition, r.start, min(r.end, r.start + PROBE_RECORDS)) for r in intent.ranges if r.span]
    events = _multi_event(client_config, pipeline, ranges, small=True)
    try:
        return next(events, None) is not None
    finally:
        events.close()  # closes the reader's consumer now, not when collected
