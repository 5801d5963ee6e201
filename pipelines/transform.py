"""Turn a batch's exact Kafka ranges into target rows and quarantine records.

Deterministic in the intent: the same ranges and ``planned_at`` give the same rows, which
is what makes a replayed batch a no-op. A record goes to quarantine (G7), never stalls
the batch, when its value is null (a tombstone), not UTF-8, not JSON, or violates the
declared schema; quarantine keeps its raw bytes, topic/partition/offset and the reason.
With ``dedup`` configured, a second copy of an event id is quarantined too (pipelines.dedup).

Every row carries ``_tidemark_event_id`` (from the configured ``event_id`` source) and,
with ``transactions.atomic``, ``_tidemark_txn``: its source transaction as the relay
stamped it (pipelines.transactions), ``released`` true when the batch's intent took the
transaction incomplete, past its timeout.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from connectors.kafka_config import fingerprint
from offsets.cut import RelayRanges
from offsets.frames import ERROR_COLUMN, BatchFrames, Guard, guarded_error
from offsets.ledger import Intent, Schemas
from pipelines import avro, protobuf
from pipelines.dedup import EVENT_ID_COLUMN, flag_duplicates
from pipelines.transactions.headers import (
    HEADERS_COLUMN,
    TXN_COLUMN,
    event_header,
    guard,
    header,
    txn_headers,
    txn_struct,
)
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from connectors.registry import Registry

log = logging.getLogger(__name__)

_CORRUPT = "_tidemark_corrupt"
_UTF8 = "_tidemark_utf8"

QUARANTINE_COLUMNS = (
    "pipeline", "batch_id", "topic", "partition", "offset", "kafka_timestamp", "key", "value", "headers",
    "error", "ingested_at",
)


#: Kafka consumer settings for reading a batch's ranges, unless the caller's options set them.
#: A batch is a bulk read of known ranges below the LSO, not a tail: fewer, larger fetches and polls,
#: no wait for more data, and heap bounded in Spark's consumer pool (docs/benchmarks.md, "Bulk Kafka reads").
BULK_READ_OPTIONS = {
    "kafka.max.partition.fetch.bytes": str(4 << 20),
    "kafka.fetch.max.bytes": str(16 << 20),
    "kafka.receive.buffer.bytes": str(4 << 20),
    "kafka.fetch.max.wait.ms": "10",
    "kafka.max.poll.records": "10000",
}


SMALL_BATCH_OFFSETS = 100_000
"""A batch with fewer offsets is read and written by at most one task per core, not one per
Kafka partition: a small batch's tasks and files cost more than its rows, and readers get fewer
small files (docs/benchmarks.md, "Small batches")."""


def reader_group(kafka_options: dict[str, str]) -> str:
    """The group id of every Kafka read of this process with these options.

    Spark pools its executors' consumers by group id and partition, and gives each read a
    fresh group id unless told one: so every batch would open new consumers (connect,
    authenticate, fetch metadata). A stable id lets a batch reuse the consumers the last one
    left (docs/benchmarks.md, "A stable reader group"). No group is ever joined or committed
    to (the reads assign their partitions), so readers sharing it do not interfere. The pool knows a consumer only by that id, so the
    id is the options' :func:`~connectors.kafka_config.fingerprint`: new consumers when a
    credential changes, and nothing said of them.
    """
    return "tidemark-read-" + fingerprint(kafka_options)


def read_ranges(spark: SparkSession, kafka_options: dict[str, str], intent: Intent) -> DataFrame:
    """Exactly the records of ``intent``'s non-empty ranges, read_committed, as Spark's Kafka rows."""
    ranges = [r for r in intent.ranges if r.span > 0]
    if not ranges:
        schema = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                  "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
        return spark.createDataFrame([], schema)
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    return (spark.read.format("kafka").options(**{**BULK_READ_OPTIONS, **kafka_options})
            .option("kafka.group.id", reader_group(kafka_options))
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "true")
            .load())


@dataclass(frozen=True)
class FrameColumns:
    """A pipeline's columns that no batch changes, built once per session and pipeline.

    Why: each ``F.*`` call and each catalog lookup is a py4j round trip, and a batch's step 4
    needs about a hundred of them (docs/benchmarks.md, "Frame columns built once").
    Spark's columns are immutable descriptions, safe to put in any number of frames.
    """

    first: dict[str, Column]
    error: Column
    event_id: Column
    constant: Callable[[Column], Column]
    txn: Column | None
    guard: Guard | None
    """:func:`~pipelines.transactions.headers.guard` without a batch's listed transactions."""
    good: list[Column]
    """The good rows' columns before the per-batch ``_tidemark_txn`` and ``_tidemark_ingested_at``."""
    ingested: Column
    bad: list[Column | str]
    is_good: Column
    is_bad: Column


#: Per session, the :class:`FrameColumns` of each pipeline configuration a job built them for
#: (a future: :func:`columns_ahead` may still be building them), and for Avro and Protobuf of
#: each set of schemas its batches decode with.
_Key = tuple[PipelineConfig, Schemas | None]
_KEPT_COLUMNS: weakref.WeakKeyDictionary[SparkSession, dict[_Key, Future[FrameColumns]]] = (
    weakref.WeakKeyDictionary())
_KEPT_LOCK = threading.Lock()

#: At most this many pipeline configurations' columns kept per session (a served driver runs a few).
KEPT_COLUMNS_PER_SESSION = 64


def frame_columns(spark: SparkSession, pipeline: PipelineConfig, schemas: Schemas | None = None,
                  registry: Registry | None = None) -> FrameColumns:
    """:class:`FrameColumns` of ``pipeline`` in ``spark`` (whose functions decide some of them);
    for Avro and Protobuf, of the batch's ``schemas``, read from ``registry``.

    Built once per session and configuration: a served driver's scheduled runs, each a new
    job, then skip the hundred-odd py4j round trips (docs/benchmarks.md, "Frame columns
    built once"). A changed configuration is another key, so it gets its own. A
    build :func:`columns_ahead` started is waited for, not repeated; a failed one is not
    kept, so its error reaches every caller waiting for it and the next call builds again.
    """
    key = (pipeline, schemas)
    future, mine = _claim_columns(spark, key)
    return _build_columns(spark, key, future, registry) if mine else future.result()


def columns_ahead(spark: SparkSession, pipeline: PipelineConfig) -> None:
    """Start building ``pipeline``'s :func:`frame_columns` on a thread, unless kept or under way.

    Why: a process's first batch of a pipeline otherwise builds them in step 3, where step
    4's pass is prepared while the claim commits, and a G3 pipeline's took longer than the
    claim (docs/benchmarks.md, "Frame columns built once"). Started before the job's LSO
    snapshot, the build overlaps that, step 1 and step 2 (the manifest read), which wait on Kafka and Delta. A failure is left for the
    batch's own call, which raises it. (Not for Avro or Protobuf, whose columns wait for the
    batch's schemas.)
    """
    if pipeline.uses_registry:
        return
    key = (pipeline, None)
    future, mine = _claim_columns(spark, key)
    if not mine:
        return

    def build() -> None:
        try:
            _build_columns(spark, key, future, None)
        except Exception as error:  # noqa: BLE001 - not kept: the batch's own call builds again and raises it
            log.debug("building %s's columns ahead failed (%s); the batch's call raises it", pipeline.name, error)

    # No Spark job runs here, as none does where step 3 builds them otherwise (its own thread).
    threading.Thread(target=build, daemon=True, name=f"tidemark-columns-{pipeline.name}").start()


def _claim_columns(spark: SparkSession, key: _Key) -> tuple[Future[FrameColumns], bool]:
    """The kept (or under way) columns of ``key``, or a new entry the caller must build (True)."""
    with _KEPT_LOCK:
        kept = _KEPT_COLUMNS.setdefault(spark, {})
        future = kept.get(key)
        if future is not None:
            return future, False
        if len(kept) >= KEPT_COLUMNS_PER_SESSION:
            kept.clear()
        future = kept[key] = Future()
        return future, True


def _build_columns(spark: SparkSession, key: _Key, future: Future[FrameColumns],
                   registry: Registry | None) -> FrameColumns:
    try:
        columns = _frame_columns(spark, key[0], key[1], registry)
    except BaseException as error:  # every waiter gets it; the entry goes, so the next call builds again
        with _KEPT_LOCK:
            if _KEPT_COLUMNS.get(spark, {}).get(key) is future:
                del _KEPT_COLUMNS[spark][key]
        future.set_exception(error)
        raise
    future.set_result(columns)
    return columns


def _frame_columns(spark: SparkSession, pipeline: PipelineConfig, schemas: Schemas | None,
                   registry: Registry | None) -> FrameColumns:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    # What Spark cannot compile to generated code (`from_json`, the higher-order functions
    # of the header count) is computed in one projection over the Kafka rows, as in the
    # peer's Kafka→Delta job: the frames' `read`. Everything after it (`check`, `good`)
    # compiles into one stage with the write. Spread over several projections, each of
    # them ran interpreted and copied every row once more.
    first: dict[str, Column] = {}
    value_error = F.when(F.col("value").isNull(), F.lit("tombstone: null value"))
    if pipeline.format == "json":
        schema = StructType.fromDDL(pipeline.schema_ddl or "")
        assert isinstance(schema, StructType)  # a column list always parses to a struct
        reserved = [f.name for f in schema.fields if f.name.startswith("_tidemark_")]
        if reserved:
            raise ConfigError(f"pipeline {pipeline.name!r}: schema field(s) {', '.join(reserved)} start with "
                              "`_tidemark_`, which Tidemark keeps for its own columns; rename them in `schema`")
        parse_schema = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
        # Tidemark's JVM validator when the session has it (infra.spark registers it), else Spark's.
        fast = spark.catalog.functionExists("tidemark_is_valid_utf8")
        valid_utf8 = F.expr("tidemark_is_valid_utf8(value)" if fast else "is_valid_utf8(value)")
        if spark.catalog.functionExists("tidemark_from_json"):  # from_json's answers, reading the bytes
            # `_UTF8` is true where the parse read the value in its own pass, which takes strict
            # UTF-8 only: most records then skip the separate check, and a copy of their value.
            flagged = StructType([*parse_schema.fields, StructField(_UTF8, BooleanType())])
            # The bytes, not `cast(value as string)`, which copies each value once more.
            first["_parsed"] = F.call_function("tidemark_from_json", F.col("value"),
                                               F.lit(flagged.json()), F.lit(_CORRUPT), F.lit(_UTF8))
            valid_utf8 = F.coalesce(F.col(f"_parsed.{_UTF8}"), valid_utf8)
        else:
            first["_parsed"] = F.from_json(F.col("value").cast("string"), parse_schema,
                                           {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
        error = F.coalesce(value_error.when(~valid_utf8, F.lit("value is not valid UTF-8")),
                           F.when(F.col("_parsed").isNull(), F.lit("value is not a JSON object"))
                           .when(F.col(f"_parsed.{_CORRUPT}").isNotNull(),
                                 F.lit(f"value does not parse as JSON matching the schema: {pipeline.schema_ddl}")))
        payload = [F.col(f"_parsed.`{f.name}`").alias(f.name) for f in schema.fields]
    elif pipeline.uses_registry:
        if schemas is None or registry is None:
            raise ConfigError(f"pipeline {pipeline.name!r}: batch without its registry schemas (planned before the "
                              f"pipeline was `format: {pipeline.format}`?); move the pipeline past it with "
                              "`tidemark offsets seek`")
        if pipeline.format == "avro":
            first["_parsed"], error, fields = avro.decode_columns(spark, registry, schemas)
        else:
            first["_parsed"], error, fields = protobuf.decode_columns(registry, schemas, pipeline)
        payload = [F.col(f"_parsed.`{name}`").alias(name) for name in fields]
    else:
        error = value_error
        payload = [F.col("value")]
    if pipeline.transactions.atomic:
        first[HEADERS_COLUMN] = txn_headers(pipeline, spark.catalog.functionExists("tidemark_txn_headers"))

    source, named = pipeline.event_id, event_header(pipeline)
    if source == "key":
        event_id = F.col("key").cast("string")
    elif named is not None and pipeline.transactions.atomic:
        event_id = F.col(HEADERS_COLUMN)["event"]  # read in the same pass as the transaction's headers
    elif named is not None:
        event_id = header(named)
    else:
        event_id = F.col(f"_parsed.`{source.removeprefix('field:')}`").cast("string")

    # The batch's own values, out of the generated code when the session can (infra.udfs): the
    # write stage then compiles once per session, not once per batch.
    constant = ((lambda c: F.call_function("tidemark_batch_constant", c))
                if spark.catalog.functionExists("tidemark_batch_constant") else (lambda c: c))

    lineage = {
        "topic": F.col("topic").alias("_kafka_topic"),
        "partition": F.col("partition").alias("_kafka_partition"),
        "offset": F.col("offset").alias("_kafka_offset"),
        "timestamp": F.col("timestamp").alias("_kafka_timestamp"),
        "key": F.col("key").alias("_kafka_key"),
        "headers": F.col("headers").alias("_kafka_headers"),
        "batch_id": F.col("_batch_id").alias("_tidemark_batch_id"),
    }
    bad: list[Column | str] = [
        F.lit(pipeline.name).alias("pipeline"), F.col("_batch_id").alias("batch_id"), "topic", "partition",
        "offset", F.col("timestamp").alias("kafka_timestamp"), "key", "value", "headers",
        F.col(ERROR_COLUMN).alias("error"), F.col("_ingested_at").alias("ingested_at")]
    return FrameColumns(
        first=first, error=error, event_id=event_id, constant=constant,
        txn=txn_struct() if pipeline.transactions.atomic else None,
        guard=guard() if pipeline.transactions.atomic else None,
        good=[*payload, *(lineage[c] for c in pipeline.lineage), F.col("_event_id").alias(EVENT_ID_COLUMN)],
        ingested=F.col("_ingested_at").alias("_tidemark_ingested_at"), bad=bad,
        is_good=F.col(ERROR_COLUMN).isNull(), is_bad=F.col(ERROR_COLUMN).isNotNull())


def good_schema(spark: SparkSession, kafka_options: dict[str, str], pipeline: PipelineConfig,
                schemas: Schemas | None = None, registry: Registry | None = None) -> StructType:
    """The schema of the rows ``pipeline``'s batches (of ``schemas``, for Avro and Protobuf) append to
    its target (analysed, no job run)."""
    from datetime import UTC, datetime

    probe = Intent(pipeline=pipeline.name, batch_id=0, writer="schema", planned_at=datetime.now(UTC), ranges=(),
                   schemas=schemas)
    built = frames(spark, kafka_options, pipeline, probe, registry=registry)
    return built.good(built.check(built.read, None)).schema


def frames(spark: SparkSession, kafka_options: dict[str, str], pipeline: PipelineConfig, intent: Intent,
           *, dedup_table: str | None = None, listed: RelayRanges = (),
           registry: Registry | None = None) -> BatchFrames:
    """The batch's frames; ``dedup_table`` is where dedup looks ids up (default: the target);
    ``listed``: what a manifest cut listed for it (the guard lets those transactions be);
    ``registry``: where an Avro or Protobuf batch's schemas are read."""
    from pyspark.sql import functions as F

    cols = frame_columns(spark, pipeline, intent.schemas, registry)  # kept per session and configuration
    constant = cols.constant

    def check(read: DataFrame, guarded: Guard | None) -> DataFrame:
        added = {
            "_batch_id": constant(F.lit(intent.batch_id).cast("bigint")),
            # aware: the instant, whatever the local zone
            "_ingested_at": constant(F.lit(intent.planned_at).cast("timestamp")),
            # Guarded: dedup below reads this error for every record, so still checks each.
            ERROR_COLUMN: cols.error if guarded is None else guarded_error(guarded, cols.error),
            "_event_id": cols.event_id}
        if cols.txn is not None:
            added[TXN_COLUMN] = cols.txn
        checked = read.withColumns(added)
        if pipeline.dedup is not None:
            checked = flag_duplicates(spark, pipeline, intent, checked, dedup_table or pipeline.target)
        return checked

    good_columns = list(cols.good)
    flag: Guard | None = None
    if pipeline.transactions.atomic:
        txn = F.col(TXN_COLUMN)
        flag = guard(listed, cols.guard)
        if intent.released:
            txn = F.when(txn.isNotNull(), txn.withField("released", txn["id"].isin(*intent.released)))
        good_columns.append(txn.alias(TXN_COLUMN))
    good_columns.append(cols.ingested)

    read = read_ranges(spark, kafka_options, intent)
    if sum(r.span for r in intent.ranges) < SMALL_BATCH_OFFSETS:
        read = read.coalesce(spark.sparkContext.defaultParallelism)
    first = cols.first
    return BatchFrames(
        read=read.withColumns(first) if first else read,
        check=check,
        good=lambda df: df.where(cols.is_good).select(*good_columns),
        bad=lambda df: df.where(cols.is_bad).select(*cols.bad),
        guard=flag,
    )
