"""What every G3 test of a relay-fed table checks at its end, read from the real topics and table:
every record once, each source transaction whole in one batch (one version), and no version
committed without rows while its batch held records to land."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from offsets.ledger import Ledger
from outbox import wire
from tests.relay_harness import RelaySetup, header
from tidemark.config import PipelineConfig


def written(setup: RelaySetup) -> tuple[Counter[str], set[tuple[str, int, int]]]:
    """Per source transaction its events in the relay's topics; and every record's (topic, partition, offset)."""
    records = setup.records()
    return (Counter(f"{header(r, wire.LSN)}/{header(r, wire.TXID)}" for r in records),
            {(r.topic, r.partition, r.offset) for r in records})


def table_rows(spark: Any, target: str) -> int:
    from offsets.tables import delta_table_exists

    return spark.read.format("delta").load(target).count() if delta_table_exists(spark, target) else 0


def assert_whole_and_progressing(spark: Any, pipeline: PipelineConfig, txns: Counter[str],
                                 offsets: set[tuple[str, int, int]]) -> int:
    """The table holds every record once, each source transaction whole in one batch (one
    version), and no version without rows; returns the number of batches that read something."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(pipeline.target)
    rows = {(r[0], r[1], r[2]) for r in table.select("_kafka_topic", "_kafka_partition", "_kafka_offset").collect()}
    assert table.count() == len(rows) and rows == offsets, f"{len(rows)} distinct rows of {len(offsets)} records"
    per_txn = table.groupBy("_tidemark_txn.id").agg(
        F.count(F.lit(1)).alias("n"), F.countDistinct("_tidemark_batch_id").alias("batches"),
        F.max("_tidemark_txn.released").alias("released")).collect()
    torn = [(r.id, r.n, txns[r.id], r.batches) for r in per_txn if r.n != txns[r.id] or r.batches != 1]
    assert not torn and not any(r.released for r in per_txn), f"torn or released: {torn[:5]}"
    writes = DeltaTable.forPath(spark, pipeline.target).history().where("operation = 'WRITE'") \
        .select("userMetadata", "operationMetrics").collect()
    batches = {i.batch_id: i for i in Ledger(spark, pipeline.ledger_path, pipeline.name).history()}
    empty = [batches[int(json.loads(w.userMetadata)["batch"])] for w in writes
             if int(w.operationMetrics.get("numOutputRows", "0")) == 0]
    # A batch over transaction markers alone (the tail of a burst) moves the offsets and lands no
    # row; a batch that had records to land and landed none would be the stall.
    with_records = [i.batch_id for i in empty
                    if any((r.topic, r.partition, o) in offsets for r in i.ranges for o in range(r.start, r.end))]
    assert not with_records, f"batches committed without rows although their ranges hold records: {with_records[:10]}"
    reading = [i for i in batches.values() if not i.is_empty]
    assert len(reading) == len(writes), f"{len(reading)} batches read records, {len(writes)} versions"
    return len(reading)
