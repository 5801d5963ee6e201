"""Does a Delta table exist at a path — asked in a way that sees other processes' commits.

``DeltaTable.isDeltaTable`` answers from the session's cached ``DeltaLog`` without
refreshing it: once a process has looked at a path whose ``_delta_log`` was still empty
(a rival's first commit in progress), it keeps answering False after the table exists.
So a negative answer is checked against the file system (through Hadoop, so object
stores work too): a commit or checkpoint file in ``_delta_log`` means the table exists,
and the next read of it refreshes the cached log. Probing with a failing ``load`` would
work as well, but makes Spark log an error for every absent table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def delta_table_exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        return True
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    log_dir = jvm.org.apache.hadoop.fs.Path(path.rstrip("/") + "/_delta_log")
    fs = log_dir.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if not fs.exists(log_dir):
        return False
    names = (status.getPath().getName() for status in fs.listStatus(log_dir))
    return any(name.endswith(".json") or ".checkpoint" in name for name in names)
