"""Source transactions in Spark (G3): the relay's headers as a column, and the planning scan.

Every event the relay writes names its source transaction (``outbox.headers``). Here
that becomes ``_tidemark_txn``, a struct of the transaction's id, the event's position,
the declared size and how many events it declares for *this pipeline's* topics; a
record without all of those headers (not from the relay) is its own transaction and
gets null. The planning scan reads a proposed batch's ranges once, headers only, and
returns for each multi-event transaction what :mod:`offsets.cut` needs to cut the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, timedelta
from typing import TYPE_CHECKING

from offsets.cut import TxnSpan, cut_ranges, overdue
from offsets.ledger import Intent
from outbox import headers as H
from tidemark.config import PipelineConfig
from tidemark.errors import TerminalError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

TXN_COLUMN = "_tidemark_txn"


class IncompleteTransactionError(TerminalError):
    """A source transaction stayed incomplete past its timeout and the policy is ``stop``."""


def header(name: str) -> Column:
    """The first value of Kafka header ``name`` as text, or null."""
    from pyspark.sql import functions as F

    match = F.filter("headers", lambda h: h["key"] == F.lit(name))
    return F.try_element_at(match, F.lit(1))["value"].cast("string")


HEADERS_COLUMN = "_tidemark_headers"
_TXN_HEADERS = {"txid": H.TXID, "lsn": H.LSN, "position": H.POSITION, "size": H.SIZE, "counts": H.TOPIC_COUNTS}


def with_txn_headers(df: DataFrame) -> DataFrame:
    """``df`` plus ``_tidemark_headers``: the relay's transaction headers as text, looked up once.

    A header lookup is a higher-order function: interpreted, and never shared by Spark's
    common-subexpression elimination. Used directly, each of the txn struct's many
    references would repeat the scan of the header array (measured: the write pass 2x
    slower). Computed in their own projection, they are read as plain struct fields.
    """
    from pyspark.sql import functions as F

    return df.withColumn(HEADERS_COLUMN, F.struct(*[header(h).alias(k) for k, h in _TXN_HEADERS.items()]))


def txn_struct(pipeline: PipelineConfig) -> Column:
    """``_tidemark_txn`` of a row of :func:`with_txn_headers`: (id, position, size, expected, released=false), or null."""
    from pyspark.sql import functions as F

    h = F.col(HEADERS_COLUMN)
    position = F.expr(f"try_cast({HEADERS_COLUMN}.position AS INT)")
    size = F.expr(f"try_cast({HEADERS_COLUMN}.size AS INT)")
    counts = F.from_json(h["counts"], "map<string,int>")
    if pipeline.topic_pattern is not None:
        pattern = f"^(?:{pipeline.topic_pattern})$"
        mine = F.map_filter(counts, lambda k, v: k.rlike(pattern))
    else:
        mine = F.map_filter(counts, lambda k, v: k.isin(*pipeline.topics))
    # Without a readable per-topic count, every event is expected here.
    expected = F.coalesce(F.aggregate(F.map_values(mine), F.lit(0), lambda acc, x: acc + x), size)
    valid = h["txid"].isNotNull() & h["lsn"].isNotNull() & position.isNotNull() & size.isNotNull() & (size > 0)
    return F.when(valid, F.struct(
        F.concat(h["lsn"], F.lit("/"), h["txid"]).alias("id"), position.alias("position"), size.alias("size"),
        expected.alias("expected"), F.lit(False).alias("released")))


def scan(spark: SparkSession, kafka_options: Mapping[str, str], pipeline: PipelineConfig,
         intent: Intent) -> list[TxnSpan]:
    """Every multi-event source transaction with an event in ``intent``'s ranges."""
    from pyspark.sql import functions as F

    from pipelines.transform import read_ranges

    raw = with_txn_headers(read_ranges(spark, dict(kafka_options), intent).select(
        "topic", "partition", "offset", "timestamp", "headers"))
    t = txn_struct(pipeline)
    events = (raw.select(t["id"].alias("id"), "topic", "partition", "offset", "timestamp",
                         t["position"].alias("position"), t["expected"].alias("expected"))
              .where(F.col("id").isNotNull() & (F.col("expected") > 1)))
    # Aggregated in Arrow on the driver, not by two Spark groupBys and a collect of Rows:
    # the events of multi-event transactions are a handful of narrow columns, and Spark's
    # shuffles and Row conversion cost ~3x the read itself (measured with bench.g3_bench).
    return spans(events.toArrow())


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


def cut(spark: SparkSession, kafka_options: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> Intent:
    """``intent`` cut at source-transaction boundaries, with the overdue ones released or refused."""
    from dataclasses import replace

    spans = scan(spark, kafka_options, pipeline, intent)
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
