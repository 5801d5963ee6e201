"""The DataFrames the quality checks judge, built from the real table, quarantine, ledger and topics.

* ``transactions``: one row per source transaction in the table, with a ``problem`` that
  is null only when the table holds every event it declares for this pipeline's topics
  (positions distinct, within ``0..size-1``; all of ``0..size-1`` when the pipeline reads
  every topic it wrote to) and it was not released incomplete.
* ``reconciliation``: one row per stretch of a partition the ledger's batches read, with
  how many times they read it (:func:`coverage`): read_committed records counted in Kafka,
  times that, against table rows plus quarantine rows from that stretch. Their
  ``difference`` must be 0: nothing lost, nothing extra. Once, unless an operator's seek
  moved the pipeline back (``--reprocess``: each record read again is in the table or, with
  dedup, quarantined as a duplicate) or forward over a stretch (``--skip``: read zero times,
  and the table must hold nothing from it).
* ``column_types``: one row per column of the pipeline's schema, with a ``problem`` that is
  null only when the table's column has the schema's type (deeply: struct fields, elements,
  keys and values), or under ``schema_evolution: additive`` a type that holds it wider.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import TYPE_CHECKING

from connectors.admin import TP, KafkaAdmin
from offsets.ledger import Intent, Ledger, Range, now_utc
from offsets.tables import delta_table_exists
from pipelines.transactions.headers import TXN_COLUMN
from pipelines.transform import read_ranges
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def transactions(table: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    t = F.col(TXN_COLUMN)
    per_txn = (table.where(t.isNotNull()).groupBy(t["id"].alias("txn")).agg(
        F.count(F.lit(1)).alias("rows"), F.countDistinct(t["position"]).alias("events"),
        F.max(t["expected"]).alias("expected"), F.max(t["size"]).alias("size"),
        F.min(t["position"]).alias("min_position"), F.max(t["position"]).alias("max_position"),
        F.max(t["released"].cast("int")).alias("released")))
    count = F.concat(F.col("events").cast("string"), F.lit(" of "), F.col("expected").cast("string"))
    problem = (F.when(F.col("released") == 1, F.concat(F.lit("released incomplete ("), count, F.lit(" events)")))
               .when(F.col("events") != F.col("expected"), F.concat(F.lit("incomplete: "), count, F.lit(" events")))
               .when(F.col("rows") != F.col("events"), F.lit("an event appears more than once"))
               .when((F.col("min_position") < 0) | (F.col("max_position") >= F.col("size")),
                     F.lit("positions outside 0..size-1"))
               .when((F.col("expected") == F.col("size")) & (F.col("max_position") != F.col("size") - 1),
                     F.lit("positions are not 0..size-1")))
    return per_txn.withColumn("problem", F.when(problem.isNotNull(), F.concat(F.col("txn"), F.lit(": "), problem)))


def column_types(spark: SparkSession, table: StructType, schema: StructType, strict: bool) -> DataFrame:
    """Per column of ``schema`` (the pipeline's payload), whether ``table``'s has its type."""
    from pyspark.sql.types import StringType, StructField
    from pyspark.sql.types import StructType as Struct

    from pipelines.evolution import SchemaConflictError, compare

    theirs = {f.name.lower(): f for f in table.fields}
    rows = []
    for field in schema.fields:
        held = theirs.get(field.name.lower())
        found, wanted = (held.dataType.simpleString() if held else None), field.dataType.simpleString()
        problem = None
        if held is None:
            problem = f"{field.name}: not in the table (the schema has {wanted})"
        elif strict and found != wanted:  # types, not nullability (a table's columns are all nullable)
            problem = f"{field.name}: {found} in the table, {wanted} in the schema"
        elif not strict:
            try:
                change = compare(Struct([held]), Struct([field]), "additive", pipeline="", target="")
            except SchemaConflictError:
                change = None
            if change is None or change.alters_table:
                problem = f"{field.name}: {found} in the table does not hold the schema's {wanted}"
        rows.append((field.name, found, wanted, problem))
    columns = Struct([StructField(n, StringType()) for n in ("column", "table_type", "schema_type", "problem")])
    return spark.createDataFrame(rows, columns)


def coverage(intents: Iterable[Intent]) -> dict[TP, list[tuple[int, int, int]]]:
    """Per partition, ``(start, end, reads)`` stretches from its first read offset to its last:
    how many times the batches read each offset (0 where a seek skipped, 2 where one
    moved back over it once). Pure.

    Batches read each partition in contiguous ranges; a range that does not start where the
    last one ended begins a new run of reading (a seek's empty range is where it moved to).
    """
    runs: dict[TP, list[list[int]]] = {}
    for intent in intents:
        for r in intent.ranges:
            mine = runs.setdefault(r.tp, [])
            if mine and mine[-1][1] == r.start:
                mine[-1][1] = r.end
            else:
                mine.append([r.start, r.end])
    found: dict[TP, list[tuple[int, int, int]]] = {}
    for tp, spans in runs.items():
        spans = [s for s in spans if s[1] > s[0]]
        if not spans:
            continue
        edges = sorted({e for s in spans for e in s})
        stretches: list[tuple[int, int, int]] = []
        for a, b in pairwise(edges):
            reads = sum(1 for s, e in spans if s <= a and b <= e)
            if stretches and stretches[-1][2] == reads and stretches[-1][1] == a:
                stretches[-1] = (stretches[-1][0], b, reads)
            else:
                stretches.append((a, b, reads))
        found[tp] = stretches
    return found


def skipped(intents: Iterable[Intent]) -> list[tuple[int, Range, str]]:
    """Ranges operators' seeks passed over: (the seek's batch, the range, how it was asked)."""
    return [(i.batch_id, r, i.seek.reason) for i in intents if i.seek is not None for r in i.seek.skipped()]


def reconciliation(spark: SparkSession, kafka_options: dict[str, str], client_config: dict[str, str],
                   pipeline: PipelineConfig, intents: list[Intent] | None = None) -> DataFrame:
    from pyspark.sql import functions as F

    if intents is None:
        intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    stretches = coverage(intents)
    with KafkaAdmin(client_config) as admin:
        bounds = admin.bounds(list(stretches)) if stretches else {}
    # Records retention already deleted cannot be counted; reconcile what Kafka still has.
    kept: list[tuple[str, int, int, int, int]] = []
    for (t, p), parts in sorted(stretches.items()):
        floor = bounds[(t, p)].log_start
        kept += [(t, p, max(a, floor), b, reads) for a, b, reads in parts if b > floor]
    schema = ("topic STRING, partition INT, from_offset BIGINT, to_offset BIGINT, reads INT, kafka_records BIGINT, "
              "table_rows BIGINT, quarantine_rows BIGINT")
    if not kept:
        return spark.createDataFrame([], schema).withColumn("difference", F.lit(0).cast("bigint"))

    hull: dict[TP, list[int]] = {}
    for t, p, a, b, _ in kept:
        span = hull.setdefault((t, p), [a, b])
        span[0], span[1] = min(span[0], a), max(span[1], b)
    ranges = tuple(sorted(Range(t, p, a, b) for (t, p), (a, b) in hull.items()))

    def stretch_of(topic: str, partition: str, offset: str):  # type: ignore[no-untyped-def]
        which = F.lit(None).cast("int")
        for index, (t, p, a, b, _) in enumerate(kept):
            which = F.when((F.col(topic) == t) & (F.col(partition) == p) & (F.col(offset) >= a)
                           & (F.col(offset) < b), F.lit(index)).otherwise(which)
        return which

    def counted(df: DataFrame, topic: str, partition: str, offset: str) -> dict[int, int]:
        grouped = df.select(stretch_of(topic, partition, offset).alias("stretch")).where("stretch IS NOT NULL")
        return {row[0]: row[1] for row in grouped.groupBy("stretch").count().collect()}

    kafka = counted(read_ranges(spark, kafka_options, Intent(pipeline.name, 0, "audit", now_utc(), ranges)),
                    "topic", "partition", "offset")

    def counts(path: str, topic: str, partition: str, offset: str, where: str = "true") -> dict[int, int]:
        if not delta_table_exists(spark, path):
            return {}
        return counted(spark.read.format("delta").load(path).where(where), topic, partition, offset)

    table = counts(pipeline.target, "_kafka_topic", "_kafka_partition", "_kafka_offset")
    quarantine = counts(pipeline.quarantine_path, "topic", "partition", "offset", f"pipeline = '{pipeline.name}'")
    rows = [(t, p, a, b, reads, kafka.get(i, 0), table.get(i, 0), quarantine.get(i, 0))
            for i, (t, p, a, b, reads) in enumerate(kept)]
    return spark.createDataFrame(rows, schema).withColumn(
        "difference", F.col("reads") * F.col("kafka_records") - F.col("table_rows") - F.col("quarantine_rows"))
