"""The DataFrames the quality checks judge, built from the real table, quarantine, ledger and topics.

* ``transactions``: one row per source transaction in the table, with a ``problem`` that
  is null only when the table holds every event it declares for this pipeline's topics
  (positions distinct, within ``0..size-1``; all of ``0..size-1`` when the pipeline reads
  every topic it wrote to) and it was not released incomplete.
* ``reconciliation``: one row per partition the ledger covers: read_committed records in
  ``[first offset, stored offset)`` counted in Kafka, against table rows plus quarantine
  rows from that range. Their ``difference`` must be 0: nothing lost, nothing extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectors.admin import KafkaAdmin
from offsets.ledger import Intent, Ledger, Range, now_utc
from offsets.tables import delta_table_exists
from pipelines.transactions.headers import TXN_COLUMN
from pipelines.transform import read_ranges
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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


def reconciliation(spark: SparkSession, kafka_options: dict[str, str], client_config: dict[str, str],
                   pipeline: PipelineConfig) -> DataFrame:
    from pyspark.sql import functions as F

    intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    first: dict[tuple[str, int], int] = {}
    end: dict[tuple[str, int], int] = {}
    for intent in intents:
        for r in intent.ranges:
            first.setdefault(r.tp, r.start)
            end[r.tp] = r.end
    with KafkaAdmin(client_config) as admin:
        bounds = admin.bounds(list(end)) if end else {}
    # Records retention already deleted cannot be counted; reconcile what Kafka still has.
    ranges = tuple(sorted(Range(t, p, max(first[(t, p)], bounds[(t, p)].log_start), end[(t, p)])
                          for t, p in end))
    schema = ("topic STRING, partition INT, from_offset BIGINT, to_offset BIGINT, kafka_records BIGINT, "
              "table_rows BIGINT, quarantine_rows BIGINT")
    if not ranges:
        return spark.createDataFrame([], schema).withColumn("difference", F.lit(0).cast("bigint"))

    kafka = read_ranges(spark, kafka_options, Intent(pipeline.name, 0, "audit", now_utc(), ranges))
    kafka_counts = {(r.topic, r.partition): r["count"] for r in kafka.groupBy("topic", "partition").count().collect()}

    def counts(path: str, topic: str, partition: str, offset: str, where: str = "true") -> dict:  # type: ignore[type-arg]
        if not delta_table_exists(spark, path):
            return {}
        df = spark.read.format("delta").load(path).where(where)
        bounded = F.lit(False)
        for r in ranges:
            bounded = bounded | ((F.col(topic) == r.topic) & (F.col(partition) == r.partition)
                                 & (F.col(offset) >= r.start) & (F.col(offset) < r.end))
        return {(row[0], row[1]): row[2] for row in df.where(bounded).groupBy(topic, partition).count().collect()}

    table = counts(pipeline.target, "_kafka_topic", "_kafka_partition", "_kafka_offset")
    quarantine = counts(pipeline.quarantine_path, "topic", "partition", "offset", f"pipeline = '{pipeline.name}'")
    rows = [(r.topic, r.partition, r.start, r.end, kafka_counts.get(r.tp, 0), table.get(r.tp, 0),
             quarantine.get(r.tp, 0)) for r in ranges]
    return spark.createDataFrame(rows, schema).withColumn(
        "difference", F.col("kafka_records") - F.col("table_rows") - F.col("quarantine_rows"))
