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


def test_a_warmed_snapshot_is_the_one_the_next_append_checks_its_txn_against(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """After a commit and a delta-rs checkpoint (step 6) the session's snapshot has no state
    computed; ``warm_snapshot`` computes it on that very snapshot, so the next append's
    ``txnAppId`` check reads it instead of rebuilding it. The fence it holds is the table's;
    a commit by another writer after the warm-up is still seen (a new snapshot), and its batch
    is still skipped on replay."""
    from offsets.tables import cached_snapshot, warm_snapshot

    table = str(tmp_path / "w")
    for batch in range(1, 7):
        _append(spark, table, batch)
    assert checkpoint_if_due(table, 5) == 5
    before = cached_snapshot(spark, table)
    assert before.version() == 5 and not before.stateReconstructionTriggered()

    assert warm_snapshot(spark, table) == 5
    warmed = cached_snapshot(spark, table)
    assert warmed.equals(before) and warmed.stateReconstructionTriggered()  # the same object, now computed
    assert warmed.transactions().get("p").get() == 6 == txn_version(table, "p")

    # Another writer (delta-rs, another process's view) commits batch 7 after the warm-up.
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(table, pa.table({"id": pa.array([700], pa.int64()), "s": ["700"]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("p", 7)]))
    _append(spark, table, 7)  # a replay of batch 7: skipped against the new snapshot's fence
    assert spark.read.format("delta").load(table).count() == 601 and txn_version(table, "p") == 7
    _append(spark, table, 8)
    assert spark.read.format("delta").load(table).count() == 701 and txn_version(table, "p") == 8


def test_the_warm_up_computes_in_its_own_settings_and_leaves_the_callers_as_they_were(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path) -> None:
    """The state is computed under ``WARM_SETTINGS`` in a copy of the session (Delta builds it in
    the thread's active session), and the thread's active session is put back: on the caller's
    thread the caller's session, on a new thread none; the caller's own settings never change."""
    import threading

    from offsets.tables import WARM_SETTINGS, cached_snapshot, warm_snapshot

    table = str(tmp_path / "s")
    for batch in range(1, 4):
        _append(spark, table, batch)
    sessions = spark._jvm.org.apache.spark.sql.SparkSession
    ours = {key: spark.conf.get(key, None) for key in WARM_SETTINGS}
    assert ours != WARM_SETTINGS
    seen: list[object] = []

    def warm_on_a_thread() -> None:
        before = sessions.getActiveSession().isDefined()
        seen.append(warm_snapshot(spark, table))
        seen.append((before, sessions.getActiveSession().isDefined()))

    thread = threading.Thread(target=warm_on_a_thread)
    thread.start()
    thread.join(120)
    assert seen == [2, (False, False)]  # versions 0-2
    assert cached_snapshot(spark, table).stateReconstructionTriggered()
    assert sessions.getActiveSession().get().equals(spark._jsparkSession)
    assert {key: spark.conf.get(key, None) for key in WARM_SETTINGS} == ours
    _append(spark, table, 4)
    assert warm_snapshot(spark, table) == 3 and sessions.getActiveSession().get().equals(spark._jsparkSession)
    assert cached_snapshot(spark, table).transactions().get("p").get() == 4 == txn_version(table, "p")


def test_the_warm_up_runs_only_where_the_session_outlives_the_batch_and_is_waited_for(  # type: ignore[no-untyped-def]
        spark, monkeypatch) -> None:
    """``keep_warm`` off (a standalone run about to stop its session): no thread. On: one warm-up
    of the target at a time, carrying the caller's Spark job group, and ``quiesce`` waits for it."""
    import threading
    from types import SimpleNamespace

    from offsets import protocol

    calls: list[tuple[str, str | None]] = []
    release = threading.Event()

    def fake_warm(session, path: str) -> int:  # type: ignore[no-untyped-def]
        calls.append((path, session.sparkContext.getLocalProperty("spark.jobGroup.id")))
        release.wait(10)
        return 1

    monkeypatch.setattr(protocol, "warm_snapshot", fake_warm)
    source = SimpleNamespace(keep_warm=False)  # the pipeline's side: only whether the session outlives the batch
    p = protocol.CommitProtocol.__new__(protocol.CommitProtocol)
    p.spark, p.target, p.pipeline, p._warming, p.source = spark, "/tables/t", "orders", None, source
    p._warm()
    assert p._warming is None and calls == []

    source.keep_warm = True
    spark.sparkContext.setJobGroup("tidemark-ingest-orders-test", "a served run")
    try:
        p._warm()
        p._warm()  # the first is still running: not a second one
        first = p._warming
        assert first is not None and first.is_alive()
        release.set()
        p.quiesce(10)
        assert not first.is_alive()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert calls == [("/tables/t", "tidemark-ingest-orders-test")]
