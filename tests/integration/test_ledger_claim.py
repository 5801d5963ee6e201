"""The ledger claim written by delta-rs (offsets.ledger.Ledger.append) on real Delta tables, read by Spark."""

from __future__ import annotations

import threading

from offsets.ledger import Intent, Ledger, Range, batch_of_commit, now_utc
from offsets.tables import txn_version


def _intent(batch: int, writer: str, end: int) -> Intent:
    return Intent("orders", batch, writer, now_utc(), (Range("t", 0, end - 10, end), Range("t", 1, 0, end)),
                  held=2, txns=3)


def test_a_claim_lands_once_and_spark_reads_what_delta_rs_wrote(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    ledger = Ledger(spark, str(tmp_path / "ledger"), "orders")
    assert ledger.append(_intent(1, "a", 10), write="first") is None, "the first append creates the ledger (Spark)"
    wanted = _intent(2, "a", 20)
    assert ledger.append(wanted, write="second") is True, "later appends are delta-rs commits"
    assert ledger.append(_intent(2, "b", 99), write="rival") is False, "a held batch id is never appended again"
    assert ledger.append(_intent(1, "b", 99), write="late") is False
    assert txn_version(ledger.path, "orders") == 2
    stored = ledger.get(2)
    assert stored is not None
    assert (stored.writer, stored.ranges, stored.held, stored.txns) == ("a", wanted.ranges, 2, 3)
    assert stored.planned_at == wanted.planned_at
    assert spark.read.format("delta").load(ledger.path).count() == 2
    history = DeltaTable.forPath(spark, ledger.path).history().select("userMetadata").collect()
    assert sorted(batch_of_commit(h.userMetadata, "orders") for h in history) == [1, 2]
    assert any('"write": "second"' in h.userMetadata or '"write":"second"' in h.userMetadata for h in history)


def test_racing_claims_of_one_batch_let_exactly_one_land(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ledger = Ledger(spark, str(tmp_path / "ledger"), "orders")
    ledger.append(_intent(1, "seed", 10))
    for batch in range(2, 8):
        start, results = threading.Barrier(4), {}

        def claim(writer: str, b: int = batch, go: threading.Barrier = start, out: dict = results) -> None:  # type: ignore[type-arg]
            go.wait()
            out[writer] = Ledger(spark, ledger.path, "orders").append(_intent(b, writer, b * 10), write=writer)

        threads = [threading.Thread(target=claim, args=(w,)) for w in "wxyz"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [w for w, ok in results.items() if ok]
        assert len(results) == 4 and len(winners) == 1, results
        assert ledger.get(batch).writer == winners[0]  # type: ignore[union-attr]
    rows = spark.read.format("delta").load(ledger.path).groupBy("batch_id").count().collect()
    assert sorted((r.batch_id, r["count"]) for r in rows) == [(b, 1) for b in range(1, 8)], "one row per batch"
