"""The ledger claim written by delta-rs (offsets.ledger.Ledger.append) on real Delta tables, read by Spark."""

from __future__ import annotations

import threading

from offsets.ledger import Intent, Ledger, Range, batch_of_commit, now_utc
from offsets.ledger import _intent as _from_row
from offsets.tables import txn_version


def _intent(batch: int, writer: str, end: int) -> Intent:
    return Intent("orders", batch, writer, now_utc(), (Range("t", 0, end - 10, end), Range("t", 1, 0, end)),
                  held=2, txns=3)


def _from_spark(row) -> Intent:  # type: ignore[no-untyped-def]
    return _from_row(row.asDict(recursive=True))


def test_a_claim_lands_once_and_spark_reads_what_delta_rs_wrote(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    ledger = Ledger(spark, str(tmp_path / "ledger"), "orders")
    assert ledger.append(_intent(1, "a", 10), write="first") is True, "the first append creates the ledger"
    wanted = _intent(2, "a", 20)
    assert ledger.append(wanted, write="second") is True, "later appends are delta-rs commits"
    assert ledger.append(_intent(2, "b", 99), write="rival") is False, "a held batch id is never appended again"
    assert ledger.append(_intent(1, "b", 99), write="late") is False
    assert txn_version(ledger.path, "orders") == 2
    (stored,) = [_from_spark(r) for r in spark.read.format("delta").load(ledger.path).where("batch_id = 2").collect()]
    assert (stored.writer, stored.ranges, stored.held, stored.txns) == ("a", wanted.ranges, 2, 3)
    assert stored.planned_at == wanted.planned_at and ledger.get(2) == stored
    assert spark.read.format("delta").load(ledger.path).count() == 2
    history = DeltaTable.forPath(spark, ledger.path).history().select("userMetadata").collect()
    assert sorted(batch_of_commit(h.userMetadata, "orders") for h in history) == [1, 2]
    assert any('"write": "second"' in h.userMetadata or '"write":"second"' in h.userMetadata for h in history)


def _claims_at_once(spark, path: str, batch: int) -> dict[str, bool | None]:  # type: ignore[no-untyped-def]
    """Four writers' claims of ``batch``, released together; what each append returned."""
    start, results = threading.Barrier(4), {}

    def claim(writer: str) -> None:
        start.wait()
        results[writer] = Ledger(spark, path, "orders").append(_intent(batch, writer, batch * 10), write=writer)

    threads = [threading.Thread(target=claim, args=(w,)) for w in "wxyz"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_racing_claims_of_one_batch_let_exactly_one_land(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ledger = Ledger(spark, str(tmp_path / "ledger"), "orders")
    ledger.append(_intent(1, "seed", 10))
    for batch in range(2, 8):
        results = _claims_at_once(spark, ledger.path, batch)
        winners = [w for w, ok in results.items() if ok]
        assert len(results) == 4 and len(winners) == 1, results
        assert ledger.get(batch).writer == winners[0]  # type: ignore[union-attr]
    rows = spark.read.format("delta").load(ledger.path).groupBy("batch_id").count().collect()
    assert sorted((r.batch_id, r["count"]) for r in rows) == [(b, 1) for b in range(1, 8)], "one row per batch"


def test_a_ledger_created_by_delta_rs_is_the_one_spark_would_create(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltalake import DeltaTable

    properties = {"delta.checkpointInterval": "100", "delta.logRetentionDuration": "interval 720 hours"}
    first = _intent(1, "a", 10)
    ours = Ledger(spark, str(tmp_path / "ours"), "orders", table_properties=properties)
    assert ours.append(first, write="w") is True
    theirs = Ledger(spark, str(tmp_path / "theirs"), "orders", table_properties=properties)
    # How Spark created a ledger before: its one-row frame, appended with the claim's txn.
    (theirs._frame(first).write.format("delta").mode("append").option("txnAppId", "orders")
     .option("txnVersion", 1).option("userMetadata", first.to_json(write="w")).options(**properties)
     .save(theirs.path))
    a, b = DeltaTable(ours.path), DeltaTable(theirs.path)
    assert a.schema().to_json() == b.schema().to_json()
    assert a.metadata().configuration == b.metadata().configuration == properties
    assert a.protocol() == b.protocol()
    assert a.transaction_version("orders") == b.transaction_version("orders") == 1
    assert [_from_spark(r) for r in spark.read.format("delta").load(ours.path).collect()] == [
        _from_spark(r) for r in spark.read.format("delta").load(theirs.path).collect()]
    assert ours.append(_intent(2, "a", 20)) is True and theirs.append(_intent(2, "a", 20)) is True


def test_racing_creators_of_a_ledger_let_exactly_one_claim_land(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "ledger")
    results = _claims_at_once(spark, path, 1)
    # The creator's commit says True; a loser's Spark append finds batch 1 held and skips it.
    winners = [w for w, ok in results.items() if ok]
    assert len(results) == 4 and len(winners) == 1 and results[winners[0]] is True, results
    rows = spark.read.format("delta").load(path).collect()
    assert [(r.batch_id, r.writer) for r in rows] == [(1, winners[0])]
    assert txn_version(path, "orders") == 1
