"""Dedup by event id: a second copy of an event goes to quarantine, never to the table.

A copy is a duplicate when an earlier good record of the same batch (lowest topic,
partition, offset) or a row of the table already carries its event id. The table is
searched in a bounded window — rows ingested ``dedup.window_days`` before the batch was
planned — at the table version fixed in the batch's intent, so a replay flags exactly
the same records. Duplicates are quarantined, not dropped, so table plus quarantine
still equals what Kafka holds (the reconciliation check) and nothing is lost.

Only good records take part: a malformed first copy does not turn a valid second copy
into a "duplicate" of something the table never got.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from offsets.frames import ERROR_COLUMN
from offsets.ledger import Intent
from offsets.tables import delta_table_exists
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EVENT_ID_COLUMN = "_tidemark_event_id"


def table_version(spark: SparkSession, path: str) -> int:
    """The table's current version, -1 if there is no table yet (what the intent records)."""
    from delta.tables import DeltaTable

    if not delta_table_exists(spark, path):
        return -1
    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])  # type: ignore[index]


def flag_duplicates(spark: SparkSession, pipeline: PipelineConfig, intent: Intent, records: DataFrame,
                    table: str) -> DataFrame:
    """``records`` (with ``_event_id`` and :data:`ERROR_COLUMN`) with duplicates given an error."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    assert pipeline.dedup is not None
    key = F.when(F.col(ERROR_COLUMN).isNull() & F.col("_event_id").isNotNull(), F.col("_event_id"))
    here = F.struct("topic", "partition", "offset")
    # Records without a key each get their own window partition instead of one huge null one.
    order = Window.partitionBy(key, F.when(key.isNull(), here)).orderBy("topic", "partition", "offset")
    first = F.first(here).over(order)
    flagged = records.withColumn("_first", F.when(key.isNotNull(), first))

    error = F.col(ERROR_COLUMN)
    version = intent.dedup_version
    if version is not None and version >= 0:
        since = intent.planned_at - timedelta(days=pipeline.dedup.window_days)
        prior = (spark.read.format("delta").option("versionAsOf", version).load(table)
                 .where(F.col("_tidemark_ingested_at") >= F.lit(since).cast("timestamp"))
                 .select(F.col(EVENT_ID_COLUMN).alias("_prior_id")).where(F.col("_prior_id").isNotNull())
                 .distinct())
        flagged = flagged.join(prior, F.col("_event_id") == F.col("_prior_id"), "left")
        error = F.coalesce(error, F.when(
            key.isNotNull() & F.col("_prior_id").isNotNull(),
            F.concat(F.lit("duplicate: event id "), F.col("_event_id"), F.lit(" is already in the table"))))
    in_batch = key.isNotNull() & (F.col("_first") != here)
    error = F.coalesce(error, F.when(in_batch, F.concat(
        F.lit("duplicate: event id "), F.col("_event_id"), F.lit(" first seen at "), F.col("_first.topic"),
        F.lit("["), F.col("_first.partition").cast("string"), F.lit("]@"), F.col("_first.offset").cast("string"),
        F.lit(" in this batch"))))
    return flagged.withColumn(ERROR_COLUMN, error).drop("_first", "_prior_id")
