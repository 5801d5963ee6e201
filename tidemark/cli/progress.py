"""A progress bar for bounded ingest and backfill, on a terminal only.

Long work (a first ingest of millions of records, a backfill) would otherwise print
nothing until it ended. The bar counts Kafka offsets (records, markers and aborted records,
which is what a batch's ranges cover) against the LSO snapshot the run goes to, and
batches done. Inside a batch it moves with the Spark job's finished tasks, so a single
large batch is not a frozen bar; that part is an estimate, the committed part is exact.
Nothing is drawn when stderr is not a terminal (a pipe, a log file, CI).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from connectors.admin import TP, PartitionBounds
    from offsets.frames import BatchResult


def planned_offsets(bounds: Mapping[TP, PartitionBounds], committed: Mapping[TP, int]) -> int:
    """Offsets between where each partition's committed batches end (its log start if none) and its LSO."""
    return sum(max(0, b.stable_end - committed.get(tp, b.log_start)) for tp, b in bounds.items())


class IngestProgress:
    """``with IngestProgress(...) as bar: job.on_batch = bar.batch`` (a no-op off a terminal)."""

    def __init__(self, spark: Any, total: int | None, label: str, *, per_batch: int | None = None,
                 console: Console | None = None) -> None:
        """``total`` offsets to go, or None when the run cannot know before it plans (a backfill from a time)."""
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal and total != 0
        self.spark = spark
        self.total = total
        self.per_batch = per_batch
        self.done = 0
        self.batches = 0
        self._stop = threading.Event()
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                             TextColumn("{task.completed:,.0f} offsets" if total is None
                                        else "{task.completed:,.0f}/{task.total:,.0f} offsets"),
                             TextColumn("{task.fields[batches]} batch(es)"), TimeElapsedColumn(),
                             console=self.console, transient=False)
        self._task = self._bar.add_task(label, total=total, batches=0)
        self._poller = threading.Thread(target=self._poll, daemon=True, name="progress")

    def __enter__(self) -> Self:
        if self.enabled:
            self._bar.start()
            self._poller.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self.enabled:
            if kind is None and self.total is not None:
                self._bar.update(self._task, completed=self.total)
            self._poller.join(2)
            self._bar.stop()

    def batch(self, result: BatchResult, seconds: float) -> None:
        """One committed batch (``IngestJob.on_batch``): the exact part of the bar moves."""
        self.batches += 1
        self.done += sum(r.span for r in result.intent.ranges)
        if self.total is not None:
            self.done = min(self.total, self.done)
        if self.enabled:
            self._bar.update(self._task, completed=self.done, batches=self.batches)

    def _poll(self) -> None:
        """Between commits: the running job's finished tasks, as a share of the batch in flight."""
        if self.total is None:
            return  # nothing to take a share of
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            done = tasks = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done, tasks = done + info.numCompletedTasks, tasks + info.numTasks
            remaining = self.total - self.done
            in_flight = min(remaining, self.per_batch) if self.per_batch else remaining
            share = done / tasks if tasks else 0.0
            self._bar.update(self._task, completed=self.done + share * in_flight)


def on_terminal() -> bool:
    return sys.stderr.isatty()
