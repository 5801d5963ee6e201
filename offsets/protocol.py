"""The commit protocol: a batch's rows and the Kafka offsets that produced them land in one
Delta commit, exactly once, whatever instant the process dies at.

Steps of :meth:`CommitProtocol.run_batch`, in order (``N`` is the newest batch id in the
ledger; docs/design.md has the table of every crash point between them):

1. **Recover.** Read intent ``N`` from the ledger and the newest batch the target table
   records (``userMetadata`` of its latest commits). If the target lacks ``N``, replay
   it: re-read exactly its ranges and write them as in steps 4-5 with
   ``txnVersion=N``. Replay is deterministic (same ranges, same ``planned_at``) and
   Delta skips any write whose ``(txnAppId, txnVersion)`` it already holds.
2. **Plan** ``N+1``: from ``N``'s end offsets (the start policy for partitions that are
   new), up to a snapshot of each partition's LSO, within the record cap.
   Nothing to read: stop.
3. **Claim.** Append intent ``N+1`` to the ledger with ``txnAppId=<pipeline>``,
   ``txnVersion=N+1``, then re-read it: another writer's intent there means another run
   owns the pipeline (:class:`ConcurrentWriterError`); its batch is never written by us.
4. **Quarantine.** Append the batch's bad records to the quarantine table with the
   same ``(txnAppId, txnVersion)``.
5. **Commit.** Append the good rows to the target with ``txnAppId=<pipeline>``,
   ``txnVersion=N+1`` and the offsets as ``userMetadata``. This Delta commit is the
   batch's commit point: rows and offsets become visible together or not at all.

Only public delta-spark APIs are used: the ``txnAppId``/``txnVersion``/``userMetadata``
writer options and ``DeltaTable.history``. ``txn`` actions survive log cleanup and
checkpoints, so the fence holds for the life of the table; the ledger (not commitInfo,
which log cleanup deletes) is the durable record of every batch's offsets.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from connectors.admin import PartitionBounds
from offsets.ledger import TP, Intent, Ledger, batch_of_commit, now_utc
from offsets.planner import plan_ranges
from tidemark.errors import TransientError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: How many of the target's newest commits step 1 inspects for our batch id.
HISTORY_WINDOW = 50

CRASH_POINTS = ("recovered", "planned", "claimed", "quarantined", "committed")


def _delta_conflicts() -> tuple[type[BaseException], ...]:
    from delta import exceptions as dx

    return (dx.ConcurrentTransactionException, dx.ConcurrentAppendException, dx.ConcurrentWriteException,
            dx.DeltaConcurrentModificationException, dx.MetadataChangedException, dx.ProtocolChangedException)


_DELTA_CONFLICTS = _delta_conflicts()


class ConcurrentWriterError(TransientError):
    """Another run of the same pipeline claimed the batch first; this run stops."""


@dataclass(frozen=True)
class BatchFrames:
    """What a batch writes: good rows for the target, bad records for quarantine."""

    good: DataFrame
    bad: DataFrame


@dataclass(frozen=True)
class BatchResult:
    intent: Intent
    replayed: bool
    rows: int
    quarantined: int


#: Builds a batch's frames from its intent; must be deterministic in the intent.
FrameBuilder = Callable[[Intent], BatchFrames]


def _crash_point(name: str) -> None:
    """Fault injection for the crash tests: SIGKILL ourselves at a named step."""
    if os.environ.get("TIDEMARK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class CommitProtocol:
    def __init__(
        self, spark: SparkSession, *, pipeline: str, target: str, quarantine: str, ledger: str,
        build_frames: FrameBuilder, partition_by: tuple[str, ...] = (),
    ) -> None:
        self.spark = spark
        self.pipeline = pipeline
        self.target = target
        self.quarantine = quarantine
        self.ledger = Ledger(spark, ledger, pipeline)
        self.build_frames = build_frames
        self.partition_by = partition_by
        self.writer_id = uuid.uuid4().hex

    # -- step 1 -------------------------------------------------------------------

    def committed_batch(self) -> int | None:
        """Newest batch id the target table records for this pipeline, if any is in reach."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self.spark, self.target):
            return None
        for commit in DeltaTable.forPath(self.spark, self.target).history(HISTORY_WINDOW).collect():
            batch = batch_of_commit(commit.userMetadata, self.pipeline)
            if batch is not None:
                return batch
        return None

    def recover(self) -> tuple[Intent | None, BatchResult | None]:
        last = self.ledger.last()
        if last is None:
            return None, None
        committed = self.committed_batch()
        if committed is not None and committed >= last.batch_id:
            return last, None
        return last, self._write(last, replayed=True)

    # -- steps 4 and 5 --------------------------------------------------------------

    def _write(self, intent: Intent, *, replayed: bool) -> BatchResult:
        frames = self.build_frames(intent)
        good = frames.good.persist()
        try:
            bad_count = frames.bad.count()
            if bad_count:
                self._append(frames.bad, self.quarantine, intent, partition_by=())
            _crash_point("quarantined")
            rows = good.count()
            # Always commit, even with no rows: the commit carries the offsets.
            self._append(good, self.target, intent, partition_by=self.partition_by)
        finally:
            good.unpersist()
        return BatchResult(intent, replayed, rows, bad_count)

    def _append(self, df: DataFrame, path: str, intent: Intent, *, partition_by: tuple[str, ...]) -> None:
        writer = (df.write.format("delta").mode("append")
                  .option("txnAppId", self.pipeline).option("txnVersion", intent.batch_id)
                  .option("userMetadata", intent.to_json()))
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(path)

    # -- the whole batch ------------------------------------------------------------

    def run_batch(
        self, bounds: Mapping[TP, PartitionBounds], new_partition_starts: Callable[[list[TP]], Mapping[TP, int]],
        max_offsets: int,
    ) -> tuple[BatchResult | None, BatchResult | None]:
        """Steps 1-5. Returns (the replay of the last batch if one ran, the new batch or None)."""
        # Step 1. Recover.
        last, replay = self.recover()
        _crash_point("recovered")

        # Step 2. Plan N+1.
        previous = last.ends() if last else {}
        fresh = [tp for tp in bounds if tp not in previous]
        starts = new_partition_starts(fresh) if fresh else {}
        ranges = plan_ranges(previous, bounds, starts, max_offsets)
        next_id = (last.batch_id if last else 0) + 1
        intent = Intent(self.pipeline, next_id, self.writer_id, now_utc(), ranges)
        if intent.is_empty and set(bounds) <= set(previous):
            return replay, None
        _crash_point("planned")

        # Step 3. Claim N+1, then confirm the claim is ours.
        try:
            self.ledger.append(intent)
        except _DELTA_CONFLICTS:
            pass  # a rival committed first; the re-read below says who owns N+1
        claimed = self.ledger.get(next_id)
        if claimed is None or claimed.writer != self.writer_id:
            raise ConcurrentWriterError(
                f"pipeline {self.pipeline!r}: batch {next_id} was claimed by another run "
                f"(writer {claimed.writer[:8] if claimed else '?'}); only one ingest per pipeline may run")
        _crash_point("claimed")

        # Steps 4 and 5. Quarantine, then commit rows and offsets together.
        result = self._write(claimed, replayed=False)
        _crash_point("committed")
        return replay, result
