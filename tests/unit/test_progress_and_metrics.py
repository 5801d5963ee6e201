"""Pure logic of the operator's view: what a progress bar counts, what a batch adds to the metrics."""

from __future__ import annotations

from datetime import UTC, datetime

from connectors.admin import PartitionBounds
from offsets.frames import BatchResult
from offsets.ledger import Intent, Range
from orchestration.metrics import Metrics
from tidemark.cli.progress import planned_offsets


def test_planned_offsets_count_from_the_committed_end_or_the_log_start() -> None:
    bounds = {("t", 0): PartitionBounds(log_start=5, stable_end=105), ("t", 1): PartitionBounds(0, 40),
              ("u", 0): PartitionBounds(10, 10)}
    assert planned_offsets(bounds, {}) == 100 + 40
    assert planned_offsets(bounds, {("t", 0): 100, ("t", 1): 40}) == 5
    assert planned_offsets(bounds, {("t", 0): 200}) == 40  # past the LSO counts as nothing left, not negative


def test_a_batch_adds_its_rows_offsets_releases_and_duration() -> None:
    metrics = Metrics()
    metrics.count_batches("p")
    before = metrics.registry.get_sample_value("tidemark_batches_total", {"pipeline": "p"})
    intent = Intent("p", 7, "w", datetime.now(UTC), (Range("t", 0, 10, 60), Range("t", 1, 0, 0)),
                    released=("0/1", "0/2"))
    metrics.batch("p", BatchResult(intent, replayed=False, rows=42, quarantined=3), 1.5)
    value = metrics.registry.get_sample_value
    assert before == 0 and value("tidemark_batches_total", {"pipeline": "p"}) == 1
    assert value("tidemark_batch_rows_total", {"pipeline": "p"}) == 42
    assert value("tidemark_quarantined_rows_total", {"pipeline": "p"}) == 3
    assert value("tidemark_batch_offsets_total", {"pipeline": "p"}) == 50
    assert value("tidemark_g3_released_transactions_total", {"pipeline": "p"}) == 2
    assert value("tidemark_batch_duration_seconds_sum", {"pipeline": "p"}) == 1.5
    assert value("tidemark_batch_duration_seconds_bucket", {"pipeline": "p", "le": "2.0"}) == 1
    assert value("tidemark_batch_duration_seconds_bucket", {"pipeline": "p", "le": "1.0"}) == 0
