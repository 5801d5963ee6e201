"""Questions about tables: existence and small files through Hadoop (so object stores
work too), and each table's ``txn`` state through delta-rs.

Does a Delta table exist at a path — asked in a way that sees other processes' commits.

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
    log_dir, fs = _hadoop_path(spark, path.rstrip("/") + "/_delta_log")
    if not fs.exists(log_dir):
        return False
    names = (status.getPath().getName() for status in fs.listStatus(log_dir))
    return any(name.endswith(".json") or ".checkpoint" in name for name in names)


def _hadoop_path(spark: SparkSession, path: str):  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    target = jvm.org.apache.hadoop.fs.Path(path)
    return target, target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]


def write_small_file(spark: SparkSession, path: str, data: bytes) -> None:
    """Write (replace) a small file through Hadoop, so it lands wherever the tables live."""
    target, fs = _hadoop_path(spark, path)
    out = fs.create(target, True)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_small_file(spark: SparkSession, path: str) -> bytes | None:
    """A small file's bytes through Hadoop, or None if it does not exist."""
    target, fs = _hadoop_path(spark, path)
    if not fs.exists(target):
        return None
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    stream = fs.open(target)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def txn_version(path: str, app_id: str) -> int | None:
    """The newest ``txnVersion`` the Delta table at ``path`` records for ``app_id``, or None.

    Read from the table's ``txn`` state by delta-rs (the ``deltalake`` package, no JVM):
    the newest checkpoint plus the commits after it, so the cost does not grow with the
    table's history, and unlike a search of recent ``commitInfo`` the answer survives log
    cleanup and any number of other writers' commits (compaction, a second pipeline).
    Object stores take their credentials from the environment, as delta-rs reads them.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path)
    except TableNotFoundError:
        return None  # no table yet, or its first commit still in flight
    return table.transaction_version(app_id)
