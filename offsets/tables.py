"""Does a Delta table exist at a path — asked in a way that sees other processes' commits.

``DeltaTable.isDeltaTable`` answers from the session's cached ``DeltaLog`` without
refreshing it: once a process has looked at a path whose ``_delta_log`` was still empty
(a rival's first commit in progress), it keeps answering False after the table exists.
Loading the table refreshes the log, so that is what this module does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Error conditions that mean "no table here yet"; anything else (say, a directory of
#: plain Parquet files) is an error the caller must see.
_ABSENT = frozenset({"PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND"})


def delta_table_exists(spark: SparkSession, path: str) -> bool:
    from pyspark.errors import AnalysisException

    try:
        spark.read.format("delta").load(path).schema  # noqa: B018  (forces a log refresh)
    except AnalysisException as exc:
        if exc.getCondition() in _ABSENT:
            return False
        raise
    return True
