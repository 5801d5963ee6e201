"""Source transactions in Spark (G3): the relay's headers as a column, and the planning scan.

Every event the relay writes names its source transaction (``outbox.headers``). Here
that becomes ``_tidemark_txn``, a struct of the transaction's id, the event's position,
the declared size and how many events it declares for *this pipeline's* topics; a
record without all of those headers (not from the relay) is its own transaction and
gets null. The planning scan reads a proposed batch's ranges once, headers only, and
returns for each multi-event transaction what :mod:`offsets.cut` needs to cut the batch;
it reads the same headers the same way in Python (:func:`txn_of`), and a test holds the
two readings equal.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self

from connectors.admin import PartitionBounds
from connectors.kafka_config import fingerprint
from connectors.preflight import group_refused
from offsets.cut import (
    Listed,
    ListedBlock,
    ListedTxn,
    TxnSpan,
    Verdict,
    cut_with_inside,
    judge,
    listed_spans,
    search_regions,
)
from offsets.ledger import TP, Intent, Wait
from offsets.protocol import Guard
from outbox import headers as H
from tidemark.config import PipelineConfig
from tidemark.errors import TerminalError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column

log = logging.getLogger(__name__)

TXN_COLUMN = "_tidemark_txn"


class IncompleteTransactionError(TerminalError):
    """A source transaction stayed incomplete past its timeout and the policy is ``stop``."""


def header(name: str) -> Column:
    """The first value of Kafka header ``name`` as text, or null.

    Found by position in the header keys, not with a higher-order function: those are
    evaluated interpreted and take the whole projection out of Spark's generated code,
    which copies every row once more per projection (see :func:`txn_headers`).
    """
    from pyspark.sql import functions as F

    headers = F.col("headers")
    first = F.get(headers["value"], F.array_position(headers["key"], name) - 1)  # position 0: null
    return F.when(F.size(headers) > 0, first.cast("string"))


HEADERS_COLUMN = "_tidemark_headers"
#: What ``tidemark_txn_headers`` reads, in the order it takes them.
_TXN_HEADERS = (H.TXID, H.LSN, H.POSITION, H.SIZE, H.SOURCE)

#: Per relay, the commit LSNs ``[low, high]`` of the source transactions a manifest read listed.
RelayRanges = tuple[tuple[str, int, int], ...]


def event_header(pipeline: PipelineConfig) -> str | None:
    """The header a pipeline's event id comes from (``event_id: header:<name>``), or None."""
    return pipeline.event_id.removeprefix("header:") if pipeline.event_id.startswith("header:") else None


def txn_headers(pipeline: PipelineConfig, fast: bool = False) -> Column:
    """``_tidemark_headers``: the record's source transaction as the relay's headers give it.

    A struct of ``txn``: the record's ``_tidemark_txn`` (:func:`txn_struct`) before any
    release, null unless the relay's headers give it an id (``<lsn>/<txid>``), a position
    and a size above 0 (``try_cast`` to INT); its ``expected`` is the sum of
    ``topic_counts`` over this pipeline's topics, or the size when that header is missing or
    unreadable. Then ``source`` (text), which :func:`guard` compares, and ``event``: the
    pipeline's event id header as :func:`header` reads it (null if its event id is not a
    header), so that a G3 pipeline reads each record's headers once, not once more for the
    event id.
    Read with ``from_json`` and higher-order functions, which Spark evaluates interpreted, it was G3's largest
    per-record cost; so with ``fast`` (the session has Tidemark's functions,
    ``infra.udfs``) one pass over the headers, ``tidemark_txn_headers``, reads them all and
    the relay's own compact form of the counts, and only a record in any other form takes
    ``from_json`` (the same answer either way; a test holds them equal).
    :mod:`pipelines.transform` computes this column in the projection that already parses
    the value; everything reading it afterwards (:func:`txn_struct`, :func:`guard`)
    compiles to generated code. Records without headers, most Kafka records, get null at
    the cost of one size check.
    """
    from pyspark.sql import functions as F

    raw = header(H.TOPIC_COUNTS)
    counts = F.from_json(raw, "map<string,int>")
    if pipeline.topic_pattern is not None:
        pattern = f"^(?:{pipeline.topic_pattern})$"
        mine = F.map_filter(counts, lambda k, v: k.rlike(pattern))
        spec = "P" + pipeline.topic_pattern
    else:
        mine = F.map_filter(counts, lambda k, v: k.isin(*pipeline.topics))
        spec = "L" + "\x01".join(pipeline.topics)
    # try_add: counts whose sum leaves INT (no relay writes them) are unreadable, so null; with
    # `+` Spark's ANSI mode failed the batch's job on them, and every retry of it again.
    counted = F.aggregate(F.map_values(mine), F.lit(0), lambda acc, x: F.try_add(acc, x))
    event = event_header(pipeline)
    if fast:
        # One pass over the headers; `counted` (from_json) only for counts not in the relay's form.
        return F.call_function("tidemark_txn_headers", F.col("headers"), F.lit(spec), F.lit(H.TOPIC_COUNTS),
                               counted, *[F.lit(h) for h in (*_TXN_HEADERS, *([event] if event is not None else []))])
    txn_id = F.concat(header(H.LSN), F.lit("/"), header(H.TXID))
    position, size = header(H.POSITION).try_cast("int"), header(H.SIZE).try_cast("int")
    txn = F.when(txn_id.isNotNull() & position.isNotNull() & (size > 0), F.struct(
        txn_id.alias("id"), position.alias("position"), size.alias("size"),
        F.coalesce(counted, size).alias("expected"), F.lit(False).alias("released")))
    return F.when(F.size("headers") > 0, F.struct(
        txn.alias("txn"), header(H.SOURCE).alias("source"),
        (header(event) if event is not None else F.lit(None).cast("string")).alias("event")))


def txn_struct() -> Column:
    """``_tidemark_txn`` of a row with :func:`txn_headers`: (id, position, size, expected, released=false), or null."""
    from pyspark.sql import functions as F

    return F.col(HEADERS_COLUMN)["txn"]


_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def _int(raw: bytes | None) -> int | None:
    """A header as an INT the way ``try_cast(... AS INT)`` reads it: digits, in range, else None."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**31) <= value < 2**31 else None


def _counts(raw: bytes | None) -> list[tuple[str, int]] | None:
    """``from_json(counts, 'map<string,int>')``: an object of whole numbers, else None; its pairs
    in order, a repeated key's each (Spark's map keeps them all, and sums them all)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw, object_pairs_hook=_Pairs)
    except ValueError:
        return None
    if not isinstance(data, _Pairs) or not all(type(v) is int and -(2**31) <= v < 2**31 for _, v in data):
        return None
    return list(data)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as :func:`json.loads` reads it with this hook: its pairs, repeats kept."""


def _counted(pairs: list[tuple[str, int]]) -> dict[str, int] | None:
    """Per topic, the counts of ``pairs`` summed in order as ``try_add`` sums them: None once a
    partial sum leaves INT (the column's ``counted`` is then null)."""
    total = 0
    here: dict[str, int] = {}
    for topic, n in pairs:
        total += n
        if not -(2**31) <= total < 2**31:
            return None
        here[topic] = here.get(topic, 0) + n
    return here


def guard(listed: RelayRanges = (), base: Guard | None = None) -> Guard:
    """For a guarded batch's write (offsets.protocol), over rows with :func:`txn_headers`:
    tripped by a record of a multi-event transaction not from one a manifest cut listed
    (``listed``: per relay, the commit LSNs of its listed transactions; every one of that
    relay's transactions in between with an event in the batch is listed, because a
    relay's manifest records follow its commit order). Without ``listed``, exactly the rows
    :func:`scan` would keep, so a batch that passes is one whose scan would have found
    nothing to cut. ``base``: ``guard()`` built before (a pipeline keeps it: each column is
    a py4j round trip), to which only ``listed`` is added.
    """
    from pyspark.sql import functions as F

    h = F.col(HEADERS_COLUMN)
    if base is None:
        txn = h["txn"]
        base = Guard(tripped=F.coalesce(txn["expected"] > 1, F.lit(False)), why=F.concat(
            F.lit("record "), F.col("topic"), F.lit(":"), F.col("partition").cast("string"), F.lit("@"),
            F.col("offset").cast("string"), F.lit(" belongs to multi-event source transaction "), txn["id"]))
    if not listed:
        return base
    # `tidemark.source` is `<relay>:<16 hex digits of the commit LSN>`: text order is commit order.
    inside = F.lit(False)
    for relay, low, high in listed:
        inside = inside | h["source"].between(H.source(relay, low), H.source(relay, high))
    return Guard(tripped=base.tripped & ~F.coalesce(inside, F.lit(False)), why=base.why)


def topic_filter(pipeline: PipelineConfig) -> Callable[[str], bool]:
    """Whether a topic named in ``topic_counts`` is one this pipeline reads (as :func:`txn_struct` decides)."""
    if pipeline.topic_pattern is not None:
        matcher = re.compile(f"^(?:{pipeline.topic_pattern})$")
        return lambda topic: matcher.search(topic) is not None
    topics = frozenset(pipeline.topics)
    return topics.__contains__


#: What the events of one transaction share: (id, expected here, per-topic counts here or None).
Shared = tuple[str, int, Mapping[str, int] | None]


def txn_of(headers: list[tuple[str, bytes | None]], mine: Callable[[str], bool],
           memo: dict[tuple[bytes | None, ...], Shared | None] | None = None) -> tuple[str, int, int] | None:
    """(id, position, expected) of a record's source transaction, as :func:`txn_struct` gives them, or None.

    ``memo`` caches what the events of one transaction share (all but the position),
    including its per-topic counts for this pipeline's topics (see :func:`declared`).
    """
    first = dict(reversed(headers))  # the first value of each header, like header()
    shared_key = (first.get(H.TXID), first.get(H.LSN), first.get(H.SIZE), first.get(H.TOPIC_COUNTS))
    if memo is not None and shared_key in memo:
        shared = memo[shared_key]
    else:
        shared = _shared(*shared_key, mine)
        if memo is not None:
            memo[shared_key] = shared
    position = _int(first.get(H.POSITION))
    if shared is None or position is None:
        return None
    return shared[0], position, shared[1]


def declared(memo: Mapping[tuple[bytes | None, ...], Shared | None]) -> dict[str, Mapping[str, int] | None]:
    """Per transaction id met by :func:`txn_of`, the events it declares per topic of this pipeline."""
    return {shared[0]: shared[2] for shared in memo.values() if shared is not None}


def _shared(txid: bytes | None, lsn: bytes | None, size_raw: bytes | None, counts_raw: bytes | None,
            mine: Callable[[str], bool]) -> Shared | None:
    size = _int(size_raw)
    if txid is None or lsn is None or size is None or size <= 0:
        return None
    counts = _counts(counts_raw)
    here = None if counts is None else _counted([(topic, n) for topic, n in counts if mine(topic)])
    expected = size if here is None else sum(here.values())
    return f"{lsn.decode('utf-8', 'replace')}/{txid.decode('utf-8', 'replace')}", expected, here


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
    transaction in ``ranges``: the records :func:`scan` keeps and :func:`guard` flags."""
    from connectors.range_reader import headed_records

    mine = topic_filter(pipeline)
    memo = {} if memo is None else memo
    for topic, partition, offset, _, headers in headed_records(client_config, ranges, small=small):
        txn = txn_of(headers, mine, memo)
        if txn is not None and txn[2] > 1:
            yield txn[0], topic, partition, offset, txn[1], txn[2]


def spans(events: pa.Table, declared: Mapping[str, Mapping[str, int] | None] | None = None) -> list[TxnSpan]:
    """One :class:`TxnSpan` per ``id`` of ``events`` (id, topic, partition, offset, position, expected).

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


#: Offsets read on each side of a pipeline's first starts for source transactions they would split.
STRADDLE_WINDOW = 5_000


def whole_starts(client_config: Mapping[str, str], pipeline: PipelineConfig, starts: Mapping[TP, int],
                 bounds: Mapping[TP, PartitionBounds], window: int = STRADDLE_WINDOW) -> dict[TP, int]:
    """A pipeline's first starts (``start: latest`` or a timestamp), moved back so that no source
    transaction has events on both sides of them.

    Starts taken per partition split a transaction that lies across them: a Kafka
    transaction's commit markers reach its partitions one by one, so a snapshot of LSOs can
    fall after its events in one partition and before them in another; and a timestamp
    falls between a transaction's events in different partitions. The part below the
    starts would never be read, and G3 would hold the rest for
    ``transactions.incomplete_timeout_seconds`` before releasing it torn. So the ``window``
    offsets above each start (open transactions' too: read uncommitted, up to the high
    watermark) name the transactions there, and the ``window`` offsets below each start
    (committed) show which of them started earlier; each such start moves back to the
    transaction's first event (:func:`pulled_back`). Nothing is written before the first
    batch records the starts, so moving them is free.
    """
    from connectors.admin import KafkaAdmin
    from connectors.range_reader import RangeReader

    with KafkaAdmin(client_config, isolation="read_uncommitted") as admin:
        high = {tp: b.stable_end for tp, b in admin.bounds(starts).items()}  # high watermarks, here
    mine = topic_filter(pipeline)
    memo: dict[tuple[bytes | None, ...], Shared | None] = {}

    def events(ranges: list[tuple[str, int, int, int]], isolation: str) -> Iterator[tuple[str, TP, int]]:
        with RangeReader(client_config, ranges, isolation=isolation, fetch_bytes=16 * 1024 * 1024,
                         partition_fetch_bytes=1024 * 1024) as reader:
            for m in reader.records():
                headers = m.headers()
                event = txn_of(headers, mine, memo) if headers else None
                if event is not None and event[2] > 1:
                    yield event[0], (m.topic(), m.partition()), m.offset()

    above = {txn for txn, _, _ in events([(t, p, s, min(s + window, high.get((t, p), s)))
                                          for (t, p), s in starts.items()], "read_uncommitted")}
    if not above:
        return dict(starts)
    floors = {tp: max(bounds[tp].log_start, s - window) for tp, s in starts.items()}
    below = list(events([(t, p, floors[(t, p)], s) for (t, p), s in starts.items()], "read_committed"))
    moved = pulled_back(starts, above, below)
    for tp in sorted(tp for tp in moved if moved[tp] != starts[tp]):
        log.info("pipeline %s: first start of %s[%d] moved back from %d to %d, to the first event of a source "
                 "transaction that lies across the starts", pipeline.name, tp[0], tp[1], starts[tp], moved[tp])
        if moved[tp] == floors[tp] and floors[tp] > bounds[tp].log_start:
            log.warning("pipeline %s: a source transaction in %s[%d] may reach below the %d records searched; "
                        "if so G3 holds it for transactions.incomplete_timeout_seconds", pipeline.name, *tp, window)
    return moved


def pulled_back(starts: Mapping[TP, int], above: set[str], below: list[tuple[str, TP, int]]) -> dict[TP, int]:
    """``starts`` moved back over every transaction in ``above`` (met at or past the starts) with
    events in ``below`` ((id, partition, offset) under the starts), and then over every
    transaction with an event in a stretch so added (it is now read, so the rest of it must be)."""
    first: dict[str, dict[TP, int]] = {}
    at: dict[TP, list[tuple[int, str]]] = {}
    for txn, tp, offset in below:
        mins = first.setdefault(txn, {})
        mins[tp] = min(offset, mins.get(tp, offset))
        at.setdefault(tp, []).append((offset, txn))
    moved = dict(starts)
    todo = [txn for txn in above if txn in first]
    done: set[str] = set()
    while todo:
        txn = todo.pop()
        if txn in done:
            continue
        done.add(txn)
        for tp, offset in first[txn].items():
            if offset < moved[tp]:
                todo += [other for o, other in at[tp] if offset <= o < moved[tp] and other not in done]
                moved[tp] = offset
    return moved


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


def cut(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent,
        bounds: Mapping[TP, PartitionBounds], last: Intent | None) -> Intent:
    """``intent`` cut at source-transaction boundaries, with those missing events past their timeout released or refused.

    ``bounds`` are the LSOs up to which a missing event would be readable; ``last`` is the
    batch before, whose waits (:class:`offsets.ledger.Wait`) this one carries on.
    """
    found_spans = scan(client_config, pipeline, intent)
    waits: Mapping[str, Wait] = last.waiting if last else {}
    incomplete = [s for s in found_spans if not s.complete]
    lso = {tp: b.stable_end for tp, b in bounds.items()}
    regions = search_regions(incomplete, intent.ends(), lso, waits)
    have = {s.txn: s.positions | (waits[s.txn].found if s.txn in waits else frozenset()) for s in incomplete}
    expected = {s.txn: s.expected for s in incomplete}
    # Apart: a waiting transaction is searched from where its last search stopped, often far
    # past the proposal, and one read of both would re-read the stretch in between.
    found: dict[str, frozenset[int]] = {}
    for waited in (False, True):
        part = {txn: r for txn, r in regions.items() if (txn in waits) is waited}
        found |= search(client_config, pipeline, part, expected, have)
    policy = pipeline.transactions
    verdict = judge(found_spans, found, lso, waits, intent.planned_at,
                    timedelta(seconds=policy.incomplete_timeout_seconds))
    return _decided(pipeline, intent, found_spans, verdict)


def _decided(pipeline: PipelineConfig, intent: Intent, found_spans: list[TxnSpan], verdict: Verdict,
             manifest: ManifestRead | None = None, inside: list[Listed] | None = None,
             count: int | None = None) -> Intent:
    """The policy applied to a verdict, and the cut: the intent as the ledger will store it."""
    policy = pipeline.transactions
    late = verdict.overdue
    if late and policy.on_incomplete == "stop":
        names = ", ".join(f"{s.txn} ({s.seen} of {s.expected} events)" for s in late[:5])
        raise IncompleteTransactionError(
            f"pipeline {pipeline.name!r}: source transaction(s) missing events below the LSO for over "
            f"{policy.incomplete_timeout_seconds:g} s: {names}. Nothing of them was written. Find the missing "
            "events (relay, retention) or set transactions.on_incomplete: release to write them flagged")
    decided = cut_with_inside(intent.ranges, found_spans, inside or (), released=[s.txn for s in late])
    waiting = {txn: w for txn, w in verdict.waits.items() if txn not in decided.released}
    if decided.released:
        longest = max((intent.planned_at - verdict.waits[s.txn].since).total_seconds() for s in late)
        log.error("ALERT pipeline %s batch %d: releasing %d source transaction(s) whose missing events stayed "
                  "unreadable for %g s or more (longest wait %.0f s), flagged _tidemark_txn.released: %s",
                  pipeline.name, intent.batch_id, len(decided.released), policy.incomplete_timeout_seconds,
                  longest, ", ".join(decided.released[:5]))
    if decided.held:
        log.info("batch %d: %d source transaction(s) not whole in this batch wait for a later one (%d of them "
                 "missing events below the LSO)", intent.batch_id, len(decided.held),
                 sum(1 for t in decided.held if t in waiting))
    cursor = intent.manifest  # a scan keeps whatever cursor the plan had
    if manifest is not None:
        cursor = (manifest.start, manifest.end, manifest.next_cursor({r.tp: r.end for r in decided.ranges}))
    return replace(intent, guarded=manifest is not None, txns=len(found_spans) if count is None else count,
                   ranges=decided.ranges,
                   released=decided.released, held=len(decided.held), waiting=waiting, manifest=cursor)


# -- G3 from the relay's manifest ------------------------------------------------------------

#: How far before the first record of a pipeline's first batch its manifest is looked for: a
#: manifest record is produced after its events, within the transaction's timeout (broker max 15 min).
MANIFEST_LOOKBACK_MS = 15 * 60 * 1000

#: How long the manifest read waits for an open relay transaction below its high watermark.
MANIFEST_WAIT_SECONDS = 3.0


@dataclass(frozen=True)
class ManifestRead:
    """What one read of the manifest found for a batch's proposed ranges."""

    start: int
    end: int
    """Manifest offsets read: ``[start, end)``."""
    listed: tuple[Listed, ...]
    """Transactions with an event inside the proposed ranges (records wholly inside as blocks)."""
    relays: RelayRanges
    """Per relay, the commit LSNs of its listed transactions (what the batch's write lets be)."""
    records: tuple[tuple[int, tuple[tuple[TP, int], ...]], ...]
    """Per record read: its offset and each of its spans' (partition, last offset): where the next read starts."""

    def next_cursor(self, ends: Mapping[TP, int]) -> int:
        """The first record with an event at or past ``ends`` (a later batch's); ``end`` when none."""
        for offset, spans in self.records:
            if any(tp in ends and last >= ends[tp] for tp, last in spans):
                return offset
        return self.end


def _manifest_consumer(client_config: Mapping[str, str], isolation: str) -> Any:
    import uuid

    from confluent_kafka import Consumer

    # A read of known extent: at the partition's end the broker must answer at once, not after
    # fetch.wait.max.ms (500 ms by default) of waiting for more.
    settings = {**client_config, "group.id": f"tidemark-manifest-{uuid.uuid4().hex[:8]}",
                "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True,
                "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10}
    if isolation == "read_uncommitted":
        # Its one fetch (:func:`_first_stamps`) wants a record per partition, not librdkafka's
        # prefetch of up to 1 MiB each.
        # (Not `queued.min.messages`: at 1, each partition's first record came a second late.)
        settings.update({"max.partition.fetch.bytes": 64 * 1024, "fetch.max.bytes": 1 << 20})
    return Consumer(settings)


#: How long consumers a run left stay kept for a later run of this process (:meth:`ManifestConsumers.kept`):
#: below brokers' ``connections.max.idle.ms`` (10 minutes by default), which would close their connections.
KEPT_SECONDS = 120.0


class ManifestConsumers:
    """The two consumers a manifest read uses, kept for a job's batches (``--follow``, a bounded
    run of several batches) and, idle, for the process's next run with the same settings
    (:meth:`kept`): a consumer's start (threads, connections, metadata) cost more than reading
    a small batch's manifest records. Between reads nothing is assigned, so nothing is
    fetched ahead. After a failed read both are closed and the next read starts new ones."""

    _idle: ClassVar[dict[str, list[tuple[float, ManifestConsumers]]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _reaper: ClassVar[threading.Timer | None] = None

    def __init__(self, client_config: Mapping[str, str]) -> None:
        self.client_config = client_config
        self._made: dict[str, Any] = {}

    @classmethod
    @contextmanager
    def kept(cls, client_config: Mapping[str, str]) -> Iterator[ManifestConsumers]:
        """Consumers for one run: those an earlier run of this process left idle with the same
        settings (``fingerprint``: a changed credential or certificate gets new ones), else new.

        Each is one run's alone while it runs; afterwards it waits :data:`KEPT_SECONDS` for
        the next run (a served driver's next scheduled ingest; 0.1 s of every run's plan
        otherwise, docs/benchmarks.md), then is closed.
        """
        key = fingerprint(dict(client_config))
        with cls._lock:
            waiting = cls._idle.get(key, [])
            consumers = waiting.pop()[1] if waiting else cls(client_config)
        try:
            yield consumers
        finally:
            with cls._lock:
                cls._idle.setdefault(key, []).append((time.monotonic(), consumers))
                if cls._reaper is None:
                    cls._reap_later()

    @classmethod
    def _reap_later(cls) -> None:
        """One timer for all kept consumers: in :data:`KEPT_SECONDS`, close the expired, and
        wait again while any are kept. (Called holding the lock.)"""
        def reap() -> None:
            cls.close_idle(older_than=KEPT_SECONDS)
            with cls._lock:
                if cls._reaper is timer:  # (not cancelled and replaced meanwhile)
                    cls._reaper = None
                    if cls._idle:
                        cls._reap_later()

        timer = cls._reaper = threading.Timer(KEPT_SECONDS, reap)
        timer.daemon = True
        timer.start()

    @classmethod
    def close_idle(cls, older_than: float = 0.0) -> int:
        """Close the kept consumers idle for at least ``older_than`` seconds; how many sets were closed."""
        now = time.monotonic()
        with cls._lock:
            stale = [c for sets in cls._idle.values() for at, c in sets if now - at >= older_than]
            for key in list(cls._idle):
                cls._idle[key] = [(at, c) for at, c in cls._idle[key] if now - at < older_than]
                if not cls._idle[key]:
                    del cls._idle[key]
            if not cls._idle and cls._reaper is not None:
                cls._reaper.cancel()  # nothing left to wait for
                cls._reaper = None
        for consumers in stale:
            consumers.close()
        return len(stale)

    def get(self, isolation: str) -> Any:
        """The ``read_uncommitted`` (watermarks, times, first records) or ``read_committed`` (records) consumer."""
        consumer = self._made.get(isolation)
        if consumer is None:
            consumer = self._made[isolation] = _manifest_consumer(self.client_config, isolation)
        return consumer

    def holds(self, consumer: Any) -> bool:
        return any(made is consumer for made in self._made.values())

    def close(self) -> None:
        made, self._made = self._made, {}
        for consumer in made.values():
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - closing what failed: the next read starts anew
                log.debug("closing a manifest consumer: %s", exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


atexit.register(ManifestConsumers.close_idle)


Limits = Mapping[str, Mapping[int, tuple[int, int]]]
"""Per topic and partition, a proposal's ``[start, end)``."""


def _limits(intent: Intent) -> dict[str, dict[int, tuple[int, int]]]:
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for r in intent.ranges:
        out.setdefault(r.topic, {})[r.partition] = (r.start, r.end)
    return out


def _decoded(raw: bytes) -> tuple[str, list[Any]] | None:
    """(relay, its entries) of one manifest record (``outbox.manifest``), read straight from its
    JSON (tens of thousands of entries per batch) by orjson, which reads these records 1.75x
    as fast as ``json`` (docs/benchmarks.md, session 22); None for anything else."""
    import orjson

    try:
        data = orjson.loads(raw)
        if data.get("v") != 1 or not isinstance(data["txns"], list):
            return None
        return str(data["relay"]), data["txns"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # not ours: the guard catches whatever it was meant to describe


def _entries(txns: list[Any], mine: Callable[[str], bool]) -> list[ListedTxn]:
    """Each transaction with its spans in this pipeline's topics (dead-lettered ones have none)."""
    try:
        return [ListedTxn(t["id"], tuple(((s[0], s[1]), s[2], s[3], s[4]) for s in t["spans"] if mine(s[0])))
                for t in txns if not t.get("dead_lettered")]
    except (KeyError, TypeError, IndexError, AttributeError):
        return []


def _block(txns: list[Any], limits: Limits, mine: Callable[[str], bool]) -> tuple[ListedBlock, list[str]] | None:
    """The record's transactions as one block when every span of theirs in this pipeline's
    topics lies inside the proposal (the common case in a batch's middle), with the first
    and last of their ids; else None. One plain loop over the spans; no per-transaction
    object is built."""
    last: dict[TP, int] = {}
    count = 0
    first_id = last_id = None
    try:
        for t in txns:
            if t.get("dead_lettered"):
                continue
            events = 0
            for s in t["spans"]:
                parts = limits.get(s[0])
                if parts is None:
                    if mine(s[0]):
                        return None  # a partition of ours outside the proposal
                    continue
                bounds = parts.get(s[1])
                if bounds is None or s[2] < bounds[0] or s[3] >= bounds[1]:
                    return None
                tp = (s[0], s[1])
                if last.get(tp, -1) < s[3]:
                    last[tp] = s[3]
                events += s[4]
            if events > 1:
                count += 1
            if events:
                first_id = first_id or t["id"]
                last_id = t["id"]
    except (KeyError, TypeError, IndexError, AttributeError):
        return None
    if first_id is None or last_id is None:
        return None  # nothing of ours: the full path decides (it lists nothing either)
    block = ListedBlock(tuple(last.items()), count, lambda: tuple(t for t in _entries(txns, mine) if t.spans))
    return block, [str(first_id), str(last_id)]


def _summarized(message: Any, limits: Limits, mine: Callable[[str], bool]) -> tuple[str, ListedBlock, list[str]] | None:
    """What :func:`_block` makes of a manifest record, from its summary header alone
    (:data:`outbox.manifest.SUMMARY_HEADER`): (relay, block, first and last id), or None
    where the record must be decoded: no or unreadable summary, a partition outside the
    proposal, nothing of ours, or a topic this pipeline does not read (the summary's count
    of multi-event transactions is over all of the record's topics). The record's entries
    are decoded only if a cut reaches the block or a wait names one of them."""
    import orjson

    from outbox.manifest import SUMMARY_HEADER

    raw = next((v for k, v in message.headers() or () if k == SUMMARY_HEADER), None)
    if raw is None:
        return None
    try:
        summary = orjson.loads(raw)
        if summary.get("v") != 1 or summary["first"] is None or summary["last"] is None:
            return None
        last = []
        for topic, partition, first, end in summary["parts"]:
            bounds = limits.get(topic, {}).get(partition)
            if bounds is None or not mine(topic) or first < bounds[0] or end >= bounds[1]:
                return None
            last.append(((topic, partition), end))
        relay, count, ids = str(summary["relay"]), int(summary["multi"]), [str(summary["first"]), str(summary["last"])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # the record itself still says it all
    value = message.value() or b""

    def expand() -> tuple[ListedTxn, ...]:
        decoded = _decoded(value)
        return tuple(t for t in _entries(decoded[1], mine) if t.spans) if decoded is not None else ()
    return relay, ListedBlock(tuple(last), count, expand), ids


def _read_record(message: Any, limits: Limits, mine: Callable[[str], bool], starts: Mapping[TP, int],
                 ends: Mapping[TP, int]) -> tuple[str, list[Listed], list[str], tuple[tuple[TP, int], ...], bool]:
    """:func:`_take` of one manifest record, with its relay: from the summary where it suffices."""
    quick = _summarized(message, limits, mine)
    if quick is not None:
        relay, block, ids = quick
        return relay, [block], ids, block.last, False
    decoded = _decoded(message.value() or b"")
    relay, txns = decoded if decoded is not None else ("", [])
    return relay, *_take(txns, limits, mine, starts, ends)


def _touches(spans: tuple[tuple[TP, int, int, int], ...], starts: Mapping[TP, int], ends: Mapping[TP, int]) -> bool:
    return any(tp in ends and first < ends[tp] and last >= starts[tp] for tp, first, last, _ in spans)


def _take(txns: list[Any], limits: Limits, mine: Callable[[str], bool], starts: Mapping[TP, int],
          ends: Mapping[TP, int]) -> tuple[list[Listed], list[str], tuple[tuple[TP, int], ...], bool]:
    """One manifest record read against a proposal: what it lists there (a block, or the
    transactions with an event inside), the ids of those for the guard's LSN range (a block's
    first and last suffice: a record lists its transactions in commit order), each partition's
    last offset in it, and whether all of it lies past the proposal's ends."""
    as_block = _block(txns, limits, mine)
    if as_block is not None:
        block, ids = as_block
        return [block], ids, block.last, False
    entries = _entries(txns, mine)
    listed: list[Listed] = [t for t in entries if _touches(t.spans, starts, ends)]
    lasts = tuple((tp, last) for t in entries for tp, _, last, _ in t.spans)
    beyond = not any(tp in ends and first < ends[tp] for t in entries for tp, first, _, _ in t.spans)
    return listed, [t.txn for t in listed if isinstance(t, ListedTxn)], lasts, beyond


def _memo(mine: Callable[[str], bool]) -> Callable[[str], bool]:
    known: dict[str, bool] = {}

    def cached(topic: str) -> bool:
        hit = known.get(topic)
        if hit is None:
            hit = known[topic] = mine(topic)
        return hit
    return cached


def _commit_lsn(txn: str) -> int | None:
    from outbox.pgoutput import DecodeError, parse_lsn

    try:
        return parse_lsn(txn.rsplit("/", 1)[0])
    except DecodeError:
        return None


def _relay_ranges(found: Mapping[str, list[str]]) -> RelayRanges:
    out = []
    for relay, txns in sorted(found.items()):
        lsns = [lsn for lsn in map(_commit_lsn, txns) if lsn is not None]
        if lsns:
            out.append((relay, min(lsns), max(lsns)))
    return tuple(out)


def read_manifest(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent,
                  cursor: int | None, consumers: ManifestConsumers | None = None) -> ManifestRead | None:
    """The manifest records that list transactions with events in ``intent``'s ranges, or None (no manifest).

    Reads from ``cursor`` (the previous batch's next cursor; for a first batch, from the
    records a little older than the ranges' first records) until it has passed the high
    watermark seen at the start, or every relay it met has written two records entirely
    past the ranges (a relay's records follow its events' order), or an open relay
    transaction holds it for :data:`MANIFEST_WAIT_SECONDS`. Stopping early costs nothing
    in correctness: the batch's write rejects any multi-event transaction the read did not list.
    ``consumers``: the job's, kept across its batches; without them, new ones closed after the read.
    """
    if pipeline.transactions.manifest_topic is None:
        return None
    if consumers is None:
        with ManifestConsumers(client_config) as own:
            return read_manifest(client_config, pipeline, intent, cursor, own)
    try:
        return _read_manifest(consumers, pipeline, intent, cursor)
    except BaseException:
        consumers.close()  # whatever state they are in, the next read starts from new ones
        raise


def _read_manifest(consumers: ManifestConsumers, pipeline: PipelineConfig, intent: Intent,
                   cursor: int | None) -> ManifestRead | None:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    client_config = consumers.client_config
    topic = pipeline.transactions.manifest_topic
    assert topic is not None
    probe = consumers.get("read_uncommitted")
    try:
        metadata = probe.list_topics(topic, timeout=15).topics.get(topic)
        if metadata is None or metadata.error is not None or len(metadata.partitions) != 1:
            return None
        low, high = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=15, cached=False)
        if cursor is None or cursor < low:
            cursor = _first_manifest_offset(probe, topic, intent, int(low), int(high))
    except KafkaException:
        consumers.close()
        return None  # the manifest is an optimisation: the scan and the guard still hold
    starts = {r.tp: r.start for r in intent.ranges}
    ends = {r.tp: r.end for r in intent.ranges}
    limits = _limits(intent)
    mine = _memo(topic_filter(pipeline))
    listed: list[Listed] = []
    by_relay: dict[str, list[str]] = {}
    records: list[tuple[int, tuple[tuple[TP, int], ...]]] = []
    streak: dict[bytes, int] = {}
    position = cursor
    reader = consumers.get("read_committed")
    reader.assign([TopicPartition(topic, 0, cursor)])
    try:
        progress = time.monotonic()
        while position < high:
            # One record at a time: a batch asks for a few records, and consume(n) would wait
            # out its whole timeout for n that do not exist (0.1 s of every small batch's plan).
            m = reader.poll(0.1)
            if m is not None and m.error() is not None:
                refused = group_refused(m.error(), client_config)
                if refused is not None:
                    raise refused  # a missing ACL, not a manifest to do without
                if m.error().code() != KafkaError._PARTITION_EOF:
                    consumers.close()
                    return None
            elif m is not None and m.offset() >= cursor:  # (below: fetched for an earlier read)
                relay, found, ids, lasts, beyond = _read_record(m, limits, mine, starts, ends)
                listed += found
                by_relay.setdefault(relay, []).extend(ids)
                records.append((m.offset(), lasts))
                streak[m.key() or b""] = streak.get(m.key() or b"", 0) + 1 if beyond else 0
            now = reader.position([TopicPartition(topic, 0)])[0].offset
            if now > position:
                position, progress = now, time.monotonic()
            if streak and min(streak.values()) >= 2:
                break
            if time.monotonic() - progress > MANIFEST_WAIT_SECONDS:
                break
    finally:
        if consumers.holds(reader):
            reader.unassign()  # nothing fetched ahead until the next read
    return ManifestRead(cursor, max(position, cursor), tuple(listed), _relay_ranges(by_relay), tuple(records))


def _first_manifest_offset(probe: Any, topic: str, intent: Intent, low: int, high: int) -> int:
    """Where a pipeline's first manifest read starts: records a little older than its ranges' first records."""
    from confluent_kafka import TopicPartition

    stamps = _first_stamps(probe, [TopicPartition(r.topic, r.partition, r.start) for r in intent.ranges if r.span])
    if not stamps:
        return high
    found = probe.offsets_for_times([TopicPartition(topic, 0, max(0, min(stamps) - MANIFEST_LOOKBACK_MS))],
                                    timeout=15)
    offset = found[0].offset
    return low if offset < 0 and offset != -1 else (high if offset < 0 else max(low, offset))


#: How long :func:`_first_stamps` waits for the first records before guessing without the rest.
FIRST_STAMPS_SECONDS = 15.0


def _first_stamps(consumer: Any, starts: list[Any]) -> list[int]:
    """The timestamps of the records at ``starts`` (or the first ones after), one per partition.

    Read with the manifest's ``read_uncommitted`` consumer, which fetches nothing else: a new
    consumer's start was half of a first batch's manifest read (docs/benchmarks.md). A
    partition that answers with an error or not in time gives nothing: the start is only a
    guess, and the batch's guard holds whatever it misses.
    """
    from confluent_kafka import KafkaError

    stamps: list[int] = []
    waiting = {(tp.topic, tp.partition) for tp in starts}
    consumer.assign(starts)
    try:
        deadline = time.monotonic() + FIRST_STAMPS_SECONDS
        while waiting and time.monotonic() < deadline:
            m = consumer.poll(0.1)
            if m is None or (m.topic(), m.partition()) not in waiting:
                continue
            waiting.discard((m.topic(), m.partition()))
            if m.error() is None:
                stamps.append(m.timestamp()[1])
            elif m.error().code() != KafkaError._PARTITION_EOF:
                log.debug("no first record of %s[%s] for the manifest's start: %s", m.topic(), m.partition(),
                          m.error())
    finally:
        consumer.unassign()
    return stamps


def listed_ranges(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> RelayRanges:
    """What the manifest listed for ``intent``'s ranges, read again from exactly the records its
    plan read (a replay's guard). Records lost since: less listed, so the guard may reject the
    batch, which is then planned with the scan: slower, never wrong."""
    from confluent_kafka import KafkaError, TopicPartition

    if intent.manifest is None or pipeline.transactions.manifest_topic is None:
        return ()
    start, end, _ = intent.manifest
    topic = pipeline.transactions.manifest_topic
    starts = {r.tp: r.start for r in intent.ranges}
    ends = {r.tp: r.end for r in intent.ranges}
    limits = _limits(intent)
    mine = _memo(topic_filter(pipeline))
    by_relay: dict[str, list[str]] = {}
    reader = _manifest_consumer(client_config, "read_committed")
    try:
        reader.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in reader.consume(num_messages=500, timeout=0.1):
                if m.error() is None and m.offset() < end:
                    relay, _, ids, _, _ = _read_record(m, limits, mine, starts, ends)
                    if relay:
                        by_relay.setdefault(relay, []).extend(ids)
                elif m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF:
                    return _relay_ranges(by_relay)
            if reader.position([TopicPartition(topic, 0)])[0].offset >= end:
                break
    finally:
        reader.close()
    return _relay_ranges(by_relay)


def cut_listed(pipeline: PipelineConfig, intent: Intent, read: ManifestRead, bounds: Mapping[TP, PartitionBounds],
               last: Intent | None) -> Intent:
    """``intent`` cut from the manifest (as :func:`cut` does from the scan), guarded against the unlisted."""
    waits: Mapping[str, Wait] = last.waiting if last else {}
    policy = pipeline.transactions
    lso = {tp: b.stable_end for tp, b in bounds.items()}
    spans, inside, verdict, count = listed_spans(read.listed, intent.ranges, lso, waits, intent.planned_at,
                                                 timedelta(seconds=policy.incomplete_timeout_seconds))
    return _decided(pipeline, intent, spans, verdict, manifest=read, inside=inside, count=count)
