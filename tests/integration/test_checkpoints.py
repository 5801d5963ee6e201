"""Checkpoints by delta-rs after Tidemark's commits (protocol step 6) on a table Spark writes: Spark
checkpoints no more in the commit path, and a Spark reader with nothing but the delta-rs checkpoint and
the commits after it (log cleanup deleted the rest) sees the same rows and the same ``txn`` fence."""

from __future__ import annotations

import shutil
from pathlib import Path

from offsets.tables import checkpoint_if_due, txn_version
from tidemark.config import MaintenanceConfig


def _append(spark, path: str, batch: int, app: str = "p") -> None:  # type: ignore[no-untyped-def]
    start = batch * 100 + (10_000 if app != "p" else 0)
    rows = spark.range(start, start + 100).selectExpr("id", "cast(id AS STRING) AS s")
    (rows.write.format("delta").mode("append").option("txnAppId", app).option("txnVersion", batch)
     .options(**MaintenanceConfig().table_properties()).save(path))


def _log(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "_delta_log").iterdir())


def test_delta_rs_checkpoints_every_interval_and_spark_reads_the_fence_from_them(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    table = tmp_path / "t"
    done = []
    for batch in range(1, 14):  # versions 0..13: app p's batches, and app q's batch 7 after p's 4th
        _append(spark, str(table), batch)
        if batch == 4:
            _append(spark, str(table), 7, app="q")
        done.append(checkpoint_if_due(str(table), 5))
    assert [v for v in done if v is not None] == [5, 10]
    assert [n for n in _log(table) if ".checkpoint" in n] == [f"{v:020d}.checkpoint.parquet" for v in (5, 10)]
    assert MaintenanceConfig().table_properties()["delta.checkpointInterval"] == "1000"  # none of them Spark's

    # Log cleanup: only the newest checkpoint and the commits after it are left, in a copy that no
    # session has read before (so Spark builds its snapshot from the delta-rs checkpoint).
    copy = tmp_path / "copy"
    shutil.copytree(table, copy)
    for name in _log(copy):
        head = name.split(".", 1)[0]
        if head.isdigit() and int(head) < 10:
            (copy / "_delta_log" / name).unlink()
    assert spark.read.format("delta").load(str(copy)).count() == 1400
    # App q's txn is in the checkpoint only: replays of it are skipped, its next batch lands.
    assert txn_version(str(copy), "q") == 7 and txn_version(str(copy), "p") == 13
    _append(spark, str(copy), 7, app="q")
    _append(spark, str(copy), 6, app="q")
    _append(spark, str(copy), 13)
    assert spark.read.format("delta").load(str(copy)).count() == 1400
    assert max(int(n.split(".")[0]) for n in _log(copy) if n.endswith(".json")) == 13
    _append(spark, str(copy), 8, app="q")
    assert spark.read.format("delta").load(str(copy)).count() == 1500 and txn_version(str(copy), "q") == 8
