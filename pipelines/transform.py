"""Turn a batch's exact Kafka ranges into target rows and quarantine records.

Deterministic in the intent: the same ranges and ``planned_at`` give the same rows, which
is what makes a replayed batch a no-op. A record goes to quarantine (G7), never stalls
the batch, when its value is null (a tombstone), not UTF-8, not JSON, or violates the
declared schema; quarantine keeps its raw bytes, topic/partition/offset and the reason.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from offsets.ledger import Intent
from offsets.protocol import ERROR_COLUMN, BatchFrames
from tidemark.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_CORRUPT = "_tidemark_corrupt"

QUARANTINE_COLUMNS = (
    "pipeline", "batch_id", "topic", "partition", "offset", "kafka_timestamp", "key", "value", "headers",
    "error", "ingested_at",
)


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
    return (spark.read.format("kafka").options(**kafka_options)
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "true")
            .load())


def frames(spark: SparkSession, kafka_options: dict[str, str], pipeline: PipelineConfig, intent: Intent) -> BatchFrames:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    raw = read_ranges(spark, kafka_options, intent)
    stamped = raw.withColumn("_batch_id", F.lit(intent.batch_id).cast("bigint")).withColumn(
        "_ingested_at", F.lit(intent.planned_at).cast("timestamp"))  # aware: the instant, whatever the local zone

    if pipeline.format == "json":
        schema = StructType.fromDDL(pipeline.schema_ddl or "")
        assert isinstance(schema, StructType)  # a column list always parses to a struct
        parse_schema = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
        text = F.col("value").cast("string")
        # Tidemark's JVM validator when the session has it (infra.spark registers it), else Spark's.
        fast = spark.catalog.functionExists("tidemark_is_valid_utf8")
        valid_utf8 = F.expr("tidemark_is_valid_utf8(value)" if fast else "is_valid_utf8(value)")
        parsed = stamped.withColumn("_parsed", F.from_json(
            text, parse_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}))
        error = (F.when(F.col("value").isNull(), F.lit("tombstone: null value"))
                 .when(~valid_utf8, F.lit("value is not valid UTF-8"))
                 .when(F.col("_parsed").isNull(), F.lit("value is not a JSON object"))
                 .when(F.col(f"_parsed.{_CORRUPT}").isNotNull(),
                       F.lit(f"value does not parse as JSON matching the schema: {pipeline.schema_ddl}")))
        checked = parsed.withColumn(ERROR_COLUMN, error)
        payload = [F.col(f"_parsed.`{f.name}`").alias(f.name) for f in schema.fields]
    else:
        checked = stamped.withColumn(ERROR_COLUMN, F.when(F.col("value").isNull(), F.lit("tombstone: null value")))
        payload = [F.col("value")]

    lineage = {
        "topic": F.col("topic").alias("_kafka_topic"),
        "partition": F.col("partition").alias("_kafka_partition"),
        "offset": F.col("offset").alias("_kafka_offset"),
        "timestamp": F.col("timestamp").alias("_kafka_timestamp"),
        "key": F.col("key").alias("_kafka_key"),
        "headers": F.col("headers").alias("_kafka_headers"),
        "batch_id": F.col("_batch_id").alias("_tidemark_batch_id"),
    }
    good_columns = [*payload, *(lineage[c] for c in pipeline.lineage), F.col("_ingested_at").alias("_tidemark_ingested_at")]
    bad_columns: list[Column | str] = [
        F.lit(pipeline.name).alias("pipeline"), F.col("_batch_id").alias("batch_id"), "topic", "partition",
        "offset", F.col("timestamp").alias("kafka_timestamp"), "key", "value", "headers",
        F.col(ERROR_COLUMN).alias("error"), F.col("_ingested_at").alias("ingested_at")]
    return BatchFrames(
        records=checked,
        good=lambda df: df.where(F.col(ERROR_COLUMN).isNull()).select(*good_columns),
        bad=lambda df: df.where(F.col(ERROR_COLUMN).isNotNull()).select(*bad_columns),
    )
