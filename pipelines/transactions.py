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

import json
import logging
import re
from collections.abc import Callable, Generator, Mapping
from datetime import UTC, timedelta
from typing import TYPE_CHECKING, Any

from offsets.cut import TxnSpan, cut_ranges, overdue
from offsets.ledger import Intent
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
_TXN_HEADERS = {"txid": H.TXID, "lsn": H.LSN, "position": H.POSITION, "size": H.SIZE}


def txn_headers(pipeline: PipelineConfig) -> Column:
    """``_tidemark_headers``: the relay's transaction headers as text, and the events it counts here.

    ``counted`` is the sum of ``topic_counts`` over this pipeline's topics (null when
    the header is missing or unreadable). It needs ``from_json`` and higher-order
    functions, which Spark evaluates interpreted, so :mod:`pipelines.transform` computes
    this column in the projection that already parses the value with ``from_json``;
    everything reading it afterwards (:func:`txn_struct`, :func:`guard`) compiles to
    generated code. Records without headers, most Kafka records, get null at the cost of
    one size check.
    """
    from pyspark.sql import functions as F

    counts = F.from_json(header(H.TOPIC_COUNTS), "map<string,int>")
    if pipeline.topic_pattern is not None:
        pattern = f"^(?:{pipeline.topic_pattern})$"
        mine = F.map_filter(counts, lambda k, v: k.rlike(pattern))
    else:
        mine = F.map_filter(counts, lambda k, v: k.isin(*pipeline.topics))
    counted = F.aggregate(F.map_values(mine), F.lit(0), lambda acc, x: acc + x)
    return F.when(F.size("headers") > 0, F.struct(
        *[header(h).alias(k) for k, h in _TXN_HEADERS.items()], counted.alias("counted")))


def txn_struct() -> Column:
    """``_tidemark_txn`` of a row with :func:`txn_headers`: (id, position, size, expected, released=false), or null."""
    from pyspark.sql import functions as F

    h = F.col(HEADERS_COLUMN)
    position = F.expr(f"try_cast({HEADERS_COLUMN}.position AS INT)")
    size = F.expr(f"try_cast({HEADERS_COLUMN}.size AS INT)")
    # Without a readable per-topic count, every event is expected here.
    expected = F.coalesce(h["counted"], size)
    valid = h["txid"].isNotNull() & h["lsn"].isNotNull() & position.isNotNull() & size.isNotNull() & (size > 0)
    return F.when(valid, F.struct(
        F.concat(h["lsn"], F.lit("/"), h["txid"]).alias("id"), position.alias("position"), size.alias("size"),
        expected.alias("expected"), F.lit(False).alias("released")))


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


def _counts(raw: bytes | None) -> dict[str, int] | None:
    """``from_json(counts, 'map<string,int>')``: an object of whole numbers, else None."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(type(v) is int and -(2**31) <= v < 2**31 for v in data.values()):
        return None
    return data


def guard(txn: Column) -> Column:
    """For a guarded batch's write (offsets.protocol): null unless the row's ``_tidemark_txn`` is multi-event.

    Exactly the rows :func:`scan` would keep, so a batch that passes is one whose scan
    would have found nothing to cut.
    """
    from pyspark.sql import functions as F

    return F.when(txn.isNotNull() & (txn["expected"] > 1), F.concat(
        F.lit("record "), F.col("topic"), F.lit(":"), F.col("partition").cast("string"), F.lit("@"),
        F.col("offset").cast("string"), F.lit(" belongs to multi-event source transaction "), txn["id"]))


def topic_filter(pipeline: PipelineConfig) -> Callable[[str], bool]:
    """Whether a topic named in ``topic_counts`` is one this pipeline reads (as :func:`txn_struct` decides)."""
    if pipeline.topic_pattern is not None:
        matcher = re.compile(f"^(?:{pipeline.topic_pattern})$")
        return lambda topic: matcher.search(topic) is not None
    topics = frozenset(pipeline.topics)
    return topics.__contains__


def txn_of(headers: list[tuple[str, bytes | None]], mine: Callable[[str], bool],
           memo: dict[tuple[bytes | None, ...], tuple[str, int] | None] | None = None) -> tuple[str, int, int] | None:
    """(id, position, expected) of a record's source transaction, as :func:`txn_struct` gives them, or None.

    ``memo`` caches what the events of one transaction share (all but the position).
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


def _shared(txid: bytes | None, lsn: bytes | None, size_raw: bytes | None, counts_raw: bytes | None,
            mine: Callable[[str], bool]) -> tuple[str, int] | None:
    size = _int(size_raw)
    if txid is None or lsn is None or size is None or size <= 0:
        return None
    counts = _counts(counts_raw)
    expected = size if counts is None else sum(n for topic, n in counts.items() if mine(topic))
    return f"{lsn.decode('utf-8', 'replace')}/{txid.decode('utf-8', 'replace')}", expected


def scan(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> list[TxnSpan]:
    """Every multi-event source transaction with an event in ``intent``'s ranges.

    Read by librdkafka on the driver, headers only (``connectors.range_reader``): Spark's
    reader would copy every value, and cost about what the batch's write costs. The
    events of multi-event transactions are gathered in Arrow chunks and aggregated there.
    """
    import pyarrow as pa

    schema = pa.schema([("id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                        ("offset", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")),
                        ("position", pa.int32()), ("expected", pa.int32())])
    rows: list[tuple[Any, ...]] = []
    chunks: list[pa.RecordBatch] = []

    def chunk() -> None:
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        chunks.append(pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema))
        rows.clear()

    ranges = [(r.topic, r.partition, r.start, r.end) for r in intent.ranges]
    for row in _multi_event(client_config, pipeline, ranges):
        rows.append(row)
        if len(rows) >= 100_000:
            chunk()
    chunk()
    return spans(pa.Table.from_batches(chunks, schema=schema))


def _multi_event(client_config: Mapping[str, str], pipeline: PipelineConfig, ranges: list[tuple[str, int, int, int]],
                 *, small: bool = False) -> Generator[tuple[str, str, int, int, int, int, int], None, None]:
    """(id, topic, partition, offset, timestamp ms, position, expected) of each event of a
    multi-event transaction in ``ranges``: the records :func:`scan` keeps and :func:`guard` flags."""
    from connectors.range_reader import headed_records

    mine = topic_filter(pipeline)
    memo: dict[tuple[bytes | None, ...], tuple[str, int] | None] = {}
    for topic, partition, offset, timestamp, headers in headed_records(client_config, ranges, small=small):
        txn = txn_of(headers, mine, memo)
        if txn is not None and txn[2] > 1:
            yield txn[0], topic, partition, offset, timestamp, txn[1], txn[2]


def spans(events: pa.Table) -> list[TxnSpan]:
    """One :class:`TxnSpan` per ``id`` of ``events`` (id, topic, partition, offset, timestamp, position, expected)."""
    import pyarrow as pa

    if events.num_rows == 0:
        return []
    events = events.set_column(events.schema.get_field_index("timestamp"), "timestamp",
                               events["timestamp"].cast(pa.timestamp("us", tz="UTC")))
    ranges = events.group_by(["id", "topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
    offsets: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
    for txn, topic, partition, first, last in zip(*(ranges[c].to_pylist() for c in (
            "id", "topic", "partition", "offset_min", "offset_max")), strict=True):
        offsets.setdefault(txn, {})[(topic, int(partition))] = (int(first), int(last))
    per_txn = events.group_by("id").aggregate(
        [("position", "count_distinct"), ("expected", "max"), ("timestamp", "min")])
    return [
        TxnSpan(txn=txn, seen=int(seen), expected=int(expected), first_timestamp=first_ts.astimezone(UTC),
                offsets=offsets[txn])
        for txn, seen, expected, first_ts in zip(*(per_txn[c].to_pylist() for c in (
            "id", "position_count_distinct", "expected_max", "timestamp_min")), strict=True)
    ]


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


def cut(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> Intent:
    """``intent`` cut at source-transaction boundaries, with the overdue ones released or refused."""
    from dataclasses import replace

    spans = scan(client_config, pipeline, intent)
    intent = replace(intent, guarded=False, txns=len(spans))
    if not spans:
        return intent
    policy = pipeline.transactions
    late = overdue(spans, intent.planned_at, timedelta(seconds=policy.incomplete_timeout_seconds))
    if late and policy.on_incomplete == "stop":
        names = ", ".join(f"{s.txn} ({s.seen} of {s.expected} events)" for s in late[:5])
        raise IncompleteTransactionError(
            f"pipeline {pipeline.name!r}: source transaction(s) incomplete for over "
            f"{policy.incomplete_timeout_seconds:g} s: {names}. Nothing of them was written. Find the missing "
            "events (relay, retention) or set transactions.on_incomplete: release to write them flagged")
    decided = cut_ranges(intent.ranges, spans, released=[s.txn for s in late])
    if decided.released:
        oldest = max((intent.planned_at - s.first_timestamp).total_seconds() for s in late)
        log.error("ALERT pipeline %s batch %d: releasing %d incomplete source transaction(s) past %g s "
                  "(oldest first seen %.0f s ago), flagged _tidemark_txn.released: %s", pipeline.name,
                  intent.batch_id, len(decided.released), policy.incomplete_timeout_seconds, oldest,
                  ", ".join(decided.released[:5]))
    if decided.held:
        log.info("batch %d: %d source transaction(s) not yet whole wait for a later batch",
                 intent.batch_id, len(decided.held))
    return replace(intent, ranges=decided.ranges, released=decided.released, held=len(decided.held))
