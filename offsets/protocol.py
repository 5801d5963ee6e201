r"""The commit protocol: a batch's rows and the Kafka offsets that produced them land in one
Delta commit, exactly once, whatever instant the process dies at.

Steps of :meth:`CommitProtocol.run_batch`, in order (``N`` is the newest batch id in the
ledger; docs/design.md has the table of every crash point between them):

1. **Recover.** Read the newest batch the target holds (its ``txn`` state for
   ``txnAppId=<pipeline>``, which survives log cleanup and other writers' commits), then
   intent ``N`` from the ledger: in that order, a rival claiming and committing meanwhile
   cannot make the target look ahead. A target ahead of its ledger means the ledger
   was deleted or replaced: stop (:class:`LedgerMismatchError`), never write past it.
   If the target lacks ``N``, replay it (steps 4-5); if it holds ``N`` but step 5 is
   not recorded (the settled marker, or the quarantine's ``txn``), redo step 5. Replay
   is deterministic (same ranges, same ``planned_at``) and Delta skips any write whose
   ``(txnAppId, txnVersion)`` it already holds.
2. **Plan** ``N+1``: from ``N``'s end offsets (the start policy for partitions that are
   new), up to a snapshot of each partition's LSO, within the record cap. Then the
   pipeline's ``decide`` (through :class:`offsets.frames.BatchSource`, the one object a
   pipeline hands the protocol) fixes what a replay must repeat, not re-make: the cut at
   source-transaction boundaries (G3, :mod:`offsets.cut`), the incomplete transactions
   released past their timeout, the table version dedup reads. A cut that leaves
   nothing grows the cap fourfold until a transaction fits whole. Nothing to read: stop
   (unless the plan starts a source transaction's wait, which the ledger must carry:
   then the empty batch is claimed and committed like any other).
   Instead of a cut, ``decide`` may mark the intent *guarded*: written uncut, with step
   4 checking every record (below).
3. **Claim.** Append intent ``N+1`` to the ledger with ``txnAppId=<pipeline>``,
   ``txnVersion=N+1`` (by delta-rs once the ledger exists: :meth:`Ledger.append`, which
   says whether it committed). Spark's append that ran its job (its ``Observation``
   completed) and returned has committed; otherwise history tells whether our append or a rival's holds
   ``N+1``: a rival's means another run owns the pipeline (:class:`ConcurrentWriterError`);
   its batch is never written by us. A rival that is an operator's seek (``tidemark offsets
   seek``: a batch with empty ranges at the new offsets) is not a rival run: the batch is
   dropped and the next one starts from the seek's ends. Meanwhile step 4's pass is built (analysed, not
   run) on a second thread: it has no side effect, and runs only if the claim is ours.
4. **Commit.** (A batch that reads nothing and is no seek commits nothing once the target
   exists: the ledger holds all of it.) Append the good rows to the target with ``txnAppId=<pipeline>``,
   ``txnVersion=N+1`` and the offsets as ``userMetadata``, in one pass over Kafka that
   also counts the records read and the rows written (two Spark ``Observation``\ s; the
   difference is the bad records). This Delta commit is the
   batch's commit point: rows and offsets become visible together or not at all.
   A guarded intent's pass also evaluates the frames' ``guard`` on every record, and
   the first record it flags fails the Spark job, so nothing commits. The batch is then
   **revised**: planned again from the same starts by the pipeline's ``revise`` (the scan
   and cut), its caps grown as step 2 grows them, so a revision moves on whenever a whole
   transaction is readable; appended to the ledger as the batch's revision (which every
   later read of the ledger, a replay included, takes instead), and step 4 runs again with it.
5. **Quarantine.** Append the batch's bad records to the quarantine table with the same
   ``(txnAppId, txnVersion)`` (confirmed like step 4's, by its ``Observation``). Only a batch with bad records is read from Kafka a
   second time; a batch without any writes nothing there. Either way the batch is then
   recorded as settled in a small marker file beside the ledger (``_tidemark_settled/``,
   naming the exact intent). The marker is only a hint: without it, step 1 finds the
   quarantine's record in its history, or else re-reads the newest batch once to count
   its bad records — correct, only slower.
6. **Checkpoint** (housekeeping after the batch, not part of it): each table the batch
   committed to gets a checkpoint by delta-rs when ``checkpoint_every`` versions have
   passed since its newest (:func:`offsets.tables.checkpoint_if_due`; Spark's own, in
   the commit, seconds long, comes at a 100 times longer interval). A failure only logs:
   the batch is committed, and Spark still checkpoints at its interval. A crash here
   leaves the batch settled; the next batch checkpoints instead. Where the session
   outlives the batch (``--follow``, ``serve``), the target's new snapshot state is then
   computed on a thread (:func:`offsets.tables.warm_snapshot`), so the next batch's
   ``txnAppId`` check in step 4 finds it ready instead of rebuilding it.

Only public APIs are used: delta-spark's ``txnAppId``/``txnVersion``/``userMetadata``
writer options and ``DeltaTable.history``, and delta-rs's ``transaction_version`` to
read a table's ``txn`` state. Which append committed is told by a write token in
``userMetadata`` read back from history, or by the append's ``Observation`` having
completed (a skipped append runs no job). ``txn`` actions survive log cleanup and
checkpoints, so the fence holds for the life of the table; the ledger (not commitInfo,
which log cleanup deletes) is the durable record of every batch's offsets.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from connectors.admin import PartitionBounds
from offsets.frames import GUARD_TRIPPED, BatchFrames, BatchResult, BatchSource
from offsets.ledger import TP, Intent, Ledger, LedgerMismatchError, commit_metadata, now_utc, recent_commits
from offsets.planner import plan_ranges
from offsets.tables import (
    checkpoint_if_due,
    delta_table_exists,
    read_small_file,
    txn_version,
    warm_snapshot,
    write_small_file,
)
from tidemark.errors import TerminalError, TransientError
from tidemark.storage import require_exclusive_commits

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

#: How many of a table's newest commits are searched for an append's own write token: a
#: few first (it is nearly always the newest), then more.
SHORT_WINDOW = 4
HISTORY_WINDOW = 50

CRASH_POINTS = ("recovered", "planned", "claimed", "committed", "quarantined")
#: Reached only when a guarded batch's check fails (its records hold a multi-event source transaction).
GUARD_CRASH_POINTS = ("revised",)

#: How far step 2 may grow a batch's caps to take a source transaction whole (4x, 16x, then 64x).
MAX_GROWTH = 64

#: How far step 2 may grow a proposal whose cut keeps less than half the cap (2x, 4x, 8x).
FILL_GROWTH = 8

#: How long step 4 waits for its Observation before asking history instead.
OBSERVATION_WAIT_SECONDS = 2.0

def _delta_conflicts() -> tuple[type[BaseException], ...]:
    from delta import exceptions as dx

    return (dx.ConcurrentTransactionException, dx.ConcurrentAppendException, dx.ConcurrentWriteException,
            dx.DeltaConcurrentModificationException, dx.MetadataChangedException, dx.ProtocolChangedException)


_DELTA_CONFLICTS = _delta_conflicts()


class BatchLimitError(TerminalError):
    """A source transaction is too large to fit whole in a batch even at the growth limit."""


class ConcurrentWriterError(TransientError):
    """Another run of the same pipeline claimed the batch first; this run stops."""


@dataclass(frozen=True)
class _Limits:
    """What this run plans its batches to: the bounds snapshot and the caps (a revision's too)."""

    bounds: Mapping[TP, PartitionBounds]
    max_offsets: int
    max_bytes: int | None = None
    weights: Mapping[TP, float] | None = None


@dataclass(frozen=True)
class _Pass:
    """Step 4's write of one intent, built before it runs (so it can be built during step 3)."""

    frames: BatchFrames
    good: DataFrame
    """The target rows; running its write is the pass."""
    read: Observation
    """Counts the records read (``records``)."""
    kept: Observation
    """Counts the rows written (``rows``); its completing proves the pass ran."""
    guarded: bool


def _completes(observation: Observation, timeout: float) -> bool:
    """Has ``observation``'s query run, waiting at most ``timeout``? False if it cannot tell.

    Observations are filled by a listener after the job, so a short wait covers the lag.
    """
    future = getattr(getattr(observation, "_jo", None), "future", None)
    if future is None:  # not a classic (py4j) session
        return False
    deadline = time.monotonic() + timeout
    while not future().isCompleted():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


#: How often a write that is still running says so.
HEARTBEAT_SECONDS = 30.0


def _described(intent: Intent) -> str:
    """``intent``'s ranges in a line: how many offsets over how many partitions, the first few."""
    reading = [r for r in intent.ranges if r.span]
    shown = ", ".join(f"{r.topic}[{r.partition}] {r.start}-{r.end}" for r in reading[:4])
    return (f"{_offsets(intent):,} offsets in {len(reading)} partition(s)" + (f": {shown}" if shown else "")
            + (" ..." if len(reading) > 4 else ""))


class _Heartbeat:
    """Logs every :data:`HEARTBEAT_SECONDS` while a batch's write runs: a replay under load can
    take minutes, and a run that says nothing meanwhile looks idle, or stuck in a restart loop.
    One watcher thread per protocol, started at its first write and idle between writes (a
    follower writes several times a second)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._changed = threading.Condition()
        self._write: tuple[str, float] | None = None
        """The write running now: what it is, and since when."""
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, what: str) -> Iterator[None]:
        if self.spark is None:
            yield
            return
        with self._changed:
            self._write = (what, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, daemon=True, name="tidemark-heartbeat")
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._write = None
                self._changed.notify()

    def _beat(self) -> None:
        while True:
            with self._changed:
                while self._write is None:
                    self._changed.wait()
                write = self._write
                self._changed.wait(HEARTBEAT_SECONDS)
                still = self._write is write
            if still:  # the same write, HEARTBEAT_SECONDS later (progress is read outside the lock)
                log.info("%s: its write has run for %.0f s%s", write[0], time.monotonic() - write[1],
                         self._progress())

    def _progress(self) -> str:
        """The tasks done of the driver's running stages (the whole session's: serve's runs share it)."""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
            total = sum(st.numTasks for st in stages if st is not None)
            done = sum(st.numCompletedTasks for st in stages if st is not None)
        except Exception:  # noqa: BLE001 - a progress line is a courtesy
            return ""
        return f" ({done} of {total} tasks of its running stages done)" if total else ""


def _offsets(intent: Intent) -> int:
    """The offsets ``intent``'s ranges span (what the record cap counts)."""
    return sum(r.span for r in intent.ranges)


def _observed(observation: Observation, name: str) -> int | None:
    """The metric ``name`` of a committed pass's ``observation``, or None where it was not filled.

    A commit confirmed by history rather than by its Observation may have its metrics lost
    with a stalled store's job events; a pass whose plan ran no task (offsets holding only
    transaction markers) fills its Observation with an empty row, which ``Observation.get``
    cannot read (an AssertionError inside ``toPyRow``). Neither is an error of the batch.
    """
    jo = getattr(observation, "_jo", None)
    try:
        if jo is not None and (not _completes(observation, OBSERVATION_WAIT_SECONDS) or jo.getRow().length() == 0):
            return None
        return int(observation.get[name])
    except Exception as exc:  # noqa: BLE001 - the commit stands; only its count is lost
        log.warning("a committed batch's %s could not be read from its Observation (%s)", name,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None


class InjectedFault(Exception):
    """A failure the tests asked for with ``TIDEMARK_RAISE_AT`` (never set in production)."""


_raised: set[str] = set()


def _crash_point(name: str, pipeline: str) -> None:
    """Fault injection for the crash tests, at a named step.

    ``TIDEMARK_CRASH_AT=<step>`` SIGKILLs the process; ``TIDEMARK_RAISE_AT=<step>:<pipeline>``
    raises :class:`InjectedFault` there, once per process: a run that fails inside a
    long-lived process (serve's warm driver) while the process goes on.
    """
    if os.environ.get("TIDEMARK_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    point = f"{name}:{pipeline}"
    if os.environ.get("TIDEMARK_RAISE_AT") == point and point not in _raised:
        _raised.add(point)
        raise InjectedFault(f"injected failure at step {name!r} of pipeline {pipeline!r} (TIDEMARK_RAISE_AT)")


#: Step 2's decisions on a planned intent (the source's ``decide``, or a revision's).
_Decide = Callable[[Intent, "Intent | None", Mapping[TP, PartitionBounds]], Intent]


class CommitProtocol:
    def __init__(
        self, spark: SparkSession, source: BatchSource, *, pipeline: str, target: str, quarantine: str, ledger: str,
        partition_by: tuple[str, ...] = (), table_properties: Mapping[str, str] | None = None,
        checkpoint_every: int | None = None,
    ) -> None:
        require_exclusive_commits(spark, (target, quarantine, ledger))
        self.spark = spark
        self.source = source
        """The pipeline's side of every batch (:class:`offsets.frames.BatchSource`): the only way
        the protocol reaches back into the pipeline."""
        self.pipeline = pipeline
        self.target = target
        self.quarantine = quarantine
        self.table_properties = dict(table_properties or {})
        """Delta properties each table is created with (writer options; an existing table keeps its own)."""
        self.ledger = Ledger(spark, ledger, pipeline, table_properties=self.table_properties)
        self.checkpoint_every = checkpoint_every
        """Step 6's interval in versions; None: Spark's own checkpoints only."""
        self.partition_by = partition_by
        self.writer_id = uuid.uuid4().hex
        self._settled: Intent | None = None
        """The newest batch this process knows is committed and settled (skips step 1's reads)."""
        self.settled_marker = f"{ledger.rstrip('/')}/_tidemark_settled/{pipeline}.json"
        self._warming: threading.Thread | None = None
        """The warm-up in flight, if any (:meth:`quiesce` waits for it)."""
        self._limits: _Limits | None = None
        """The bounds and caps of the batch being planned (None: a batch planned elsewhere, a backfill's)."""
        self._heartbeat = _Heartbeat(spark)

    def forget(self) -> None:
        """Read the tables at the next step 1 instead of trusting this process's last settled batch:
        after a batch failed half-way (an outage), the ledger may hold a claim this process made."""
        self._settled = None

    def _reached(self, step: str) -> None:
        self.source.reached(step)
        _crash_point(step, self.pipeline)

    # -- what the tables record -------------------------------------------------------

    def committed_batch(self, path: str | None = None) -> int:
        """Newest batch a table (default: the target) holds for this pipeline: its ``txn`` state, 0 if none."""
        return txn_version(path or self.target, self.pipeline) or 0

    def _landed(self, path: str, intent: Intent, token: str) -> bool:
        """Did the append tagged ``token`` commit, or did Delta skip it (batch already there)?

        Its commit is nearly always the newest, so the last few commits are read first.
        """
        for window in (SHORT_WINDOW, HISTORY_WINDOW):
            commits, read = recent_commits(self.spark, path, self.pipeline, window)
            if any(m["batch"] == intent.batch_id and m.get("write") == token for m in commits):
                return True
            if read < window:
                return False
        return False

    # -- step 1 -------------------------------------------------------------------

    def recover(self) -> tuple[Intent | None, BatchResult | None]:
        if self._settled is not None:
            # This process committed and settled it; a rival since then cannot hold
            # the next claim without step 3 noticing.
            return self._settled, None
        # The target first, then the ledger: every batch is claimed before it is committed, so a
        # ledger read after the target holds at least what the target held, even while a rival
        # run claims and commits meanwhile (read the other way round, its new batch would look
        # like a target ahead of its ledger).
        committed = self.committed_batch()
        last = self.ledger.last()
        if committed > (last.batch_id if last else 0):
            # Claims always precede their rows, so only a lost ledger leaves the target ahead:
            # its batches' offsets are unknown, and writing on would skip or repeat records.
            raise LedgerMismatchError(
                f"pipeline {self.pipeline!r}: the target {self.target} holds batch {committed}, but its ledger "
                f"{self.ledger.path} " + (f"ends at batch {last.batch_id}" if last else "is missing or empty")
                + "; it was deleted, replaced or restored, so the offsets the target holds are unknown. Nothing was "
                "written. Restore the ledger, or ingest into a new target (docs/runbooks.md, 'Recovery')")
        if last is None:
            return None, None
        if committed < last.batch_id:
            log.info("pipeline %s: batch %d was claimed but the target does not hold it: recovering it (%s)",
                     self.pipeline, last.batch_id, _described(last))
            result = self._write(last, replayed=True)
            last = result.intent  # the revision, if the replay revised it
        elif self._marked_settled(last) or self.committed_batch(self.quarantine) >= last.batch_id:
            self._settled = last
            return last, None
        else:
            # Committed, but step 5 is not recorded: count the batch's bad records again.
            quarantined = self._quarantine(last, self.source.frames(last), bad_count=None)
            result = BatchResult(last, True, 0, quarantined)
        self._mark_settled(last)
        return last, result

    # -- steps 4 and 5 --------------------------------------------------------------

    def _prepare(self, intent: Intent) -> _Pass:
        """Step 4's pass over ``intent``, built but not run (no Spark job, no side effect)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        frames = self.source.frames(intent)
        tag = f"{self.pipeline}-{intent.batch_id}-{uuid.uuid4().hex[:8]}"
        read, kept = Observation(f"tidemark-read-{tag}"), Observation(f"tidemark-kept-{tag}")
        # A pipeline without G3 (no guard) writes a guarded intent as it stands. The guard is
        # folded into the error column (:func:`guarded_error`), not a filter of its own, which
        # Spark would push down past the parse, repeating the guard's expressions.
        guard = frames.guard if intent.guarded else None
        records = frames.check(frames.read.observe(read, F.count(F.lit(1)).alias("records")), guard)
        good = frames.good(records).observe(kept, F.count(F.lit(1)).alias("rows"))
        return _Pass(frames, good, read, kept, guarded=guard is not None)

    def _write(self, intent: Intent, *, replayed: bool, prepared: _Pass | None = None) -> BatchResult:
        """Steps 4 and 5 of ``intent``, or of its revision if its guard trips (the result names which)."""
        if intent.is_empty and intent.seek is None and delta_table_exists(self.spark, self.target):
            # Nothing read and no end moved (a wait's start, a new partition's start): the ledger
            # holds all there is of it, and a version of the target would be an empty file. (A
            # pipeline's first batch creates the target even so: its readers find a table.)
            self._reached("committed")
            return BatchResult(intent, replayed, 0, 0)
        step = prepared if prepared is not None else self._prepare(intent)
        # Commit even a batch without good rows: the commit carries the offsets.
        try:
            with self._heartbeat.watching(f"pipeline {self.pipeline}: batch {intent.batch_id}"
                            + (" (recovered)" if replayed else "")):
                landed = self._append(step.good, self.target, intent, partition_by=self.partition_by,
                                      observation=step.kept)
        except Exception as error:  # only the guard's own failure is handled here
            if not step.guarded or GUARD_TRIPPED not in str(error):
                raise
            return self._write(self._revision(intent, error), replayed=replayed)
        self._reached("committed")
        # A skipped append runs no job, so its observations would never complete; an empty
        # batch's (a seek, a wait's start) reads nothing, and Spark's observed row of it is empty.
        bad: int | None
        if landed and intent.is_empty:
            rows, bad = 0, 0
        elif landed:
            kept, records = _observed(step.kept, "rows"), _observed(step.read, "records")
            if kept is None or records is None:
                rows, bad = self._committed_rows(intent), None  # step 5 counts the bad records again
            else:
                rows, bad = kept, records - kept
        else:
            rows, bad = 0, None
        quarantined = self._quarantine(intent, step.frames, bad_count=bad)
        return BatchResult(intent, replayed, rows, quarantined)

    def _committed_rows(self, intent: Intent) -> int:
        """The rows ``intent``'s commit added to the target, from its commit's metrics (one read of
        the newest commit files), for a pass whose Observation holds no count."""
        from delta.tables import DeltaTable

        commits = DeltaTable.forPath(self.spark, self.target).history(HISTORY_WINDOW) \
            .select("userMetadata", "operationMetrics").collect()
        for commit in commits:
            meta = commit_metadata(commit.userMetadata, self.pipeline)
            if meta is not None and meta["batch"] == intent.batch_id:
                return int((commit.operationMetrics or {}).get("numOutputRows", 0))
        return 0

    def _revision(self, intent: Intent, error: Exception) -> Intent:
        """Guarded ``intent``'s revision, as the ledger stores it (ours, or a racing rival's)."""
        from pyspark.sql import Observation

        why = re.search(re.escape(GUARD_TRIPPED) + r"(.*?)(?: SQLSTATE|\n|$)", str(error))
        log.info("batch %d: %s; planning it again with the scan (docs/design.md, G3 without a scan)",
                 intent.batch_id, why.group(1) if why else "a record belongs to a multi-event source transaction")
        # No revision is stored yet: step 1 would have read it instead of this guarded claim
        # (unless a rival's replay is revising it right now, which Delta settles below).
        revised = self._replanned(intent)  # never guarded: Ledger.append refuses a guarded revision
        seen = Observation(f"tidemark-revision-{self.pipeline}-{intent.batch_id}-{uuid.uuid4().hex[:8]}")
        try:
            committed = self.ledger.append(revised, write=uuid.uuid4().hex, revision=True, observation=seen)
            # Spark's append: it ran its job and returned, so it committed.
            ours = committed if committed is not None else _completes(seen, OBSERVATION_WAIT_SECONDS)
        except _DELTA_CONFLICTS:
            ours = False  # a rival's replay revised it first (the same revision: the scan is deterministic)
        self._reached("revised")
        stored = revised if ours else self.ledger.get(intent.batch_id)
        if stored is None or stored.guarded:
            raise TransientError(f"batch {intent.batch_id}: its revision is not in the ledger {self.ledger.path} "
                                 "yet; run again (the next run revises it or reads it)")
        return stored

    def _replanned(self, guarded: Intent) -> Intent:
        """``guarded``'s batch planned again by the pipeline's ``revise``, from the same starts.

        Not a cut of the guarded ranges: those were cut without the transactions that tripped
        the guard, so the first of them can sit at the ranges' very start, and a cut within
        them would leave nothing, batch after batch. The caps grow as in step 2 instead
        (:meth:`_plan`). The manifest cursor is dropped: the read it came from missed what
        tripped the guard, so the next batch finds its manifest records again by time.
        """
        revise = self.source.revise
        kept = replace(guarded, guarded=False, manifest=None)
        limits = self._limits
        starts = {r.tp: r.start for r in guarded.ranges}
        if limits is None or not set(starts) <= set(limits.bounds):
            return revise(kept, self.ledger.get(guarded.batch_id - 1) if guarded.batch_id > 1 else None, None)
        last = self.ledger.get(guarded.batch_id - 1) if guarded.batch_id > 1 else None
        bounds = {tp: limits.bounds[tp] for tp in starts}
        weights = None if limits.weights is None else {tp: w for tp, w in limits.weights.items() if tp in starts}

        def decide(proposal: Intent, before: Intent | None, to: Mapping[TP, PartitionBounds]) -> Intent:
            return revise(replace(kept, ranges=proposal.ranges), before, to)

        revised = self._plan(guarded.batch_id, last, bounds, starts, limits.max_offsets, limits.max_bytes, weights,
                             decide=decide)
        # Decided proposals keep the guarded intent's decisions; an empty one comes back undecided.
        return revised if revised.planned_at == guarded.planned_at else replace(kept, ranges=revised.ranges)

    def _quarantine(self, intent: Intent, frames: BatchFrames, *, bad_count: int | None) -> int:
        """Step 5. ``bad_count`` None means unknown (a recovery): the batch is read again to count."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if bad_count == 0:
            return 0  # nothing to write; the settled marker records the batch
        bad = frames.bad(frames.records)
        if bad_count is None:
            bad = bad.persist()
        try:
            if bad_count is None:
                bad_count = bad.count()
            if bad_count == 0:
                return 0  # as above: no quarantine table for a pipeline without bad records
            # Its Observation completing proves the append ran, as step 4's does: no history read.
            seen = Observation(f"tidemark-quarantine-{self.pipeline}-{intent.batch_id}-{uuid.uuid4().hex[:8]}")
            landed = self._append(bad.observe(seen, F.count(F.lit(1)).alias("rows")), self.quarantine, intent,
                                  partition_by=(), observation=seen)
        finally:
            bad.unpersist()
        return bad_count if landed else 0

    def _mark_settled(self, intent: Intent) -> None:
        """Record that ``intent``'s steps 4 and 5 are done (a hint for step 1; see the module doc)."""
        write_small_file(self.spark, self.settled_marker, self._marker(intent))
        self._settled = intent

    def _marked_settled(self, intent: Intent) -> bool:
        return read_small_file(self.spark, self.settled_marker) == self._marker(intent)

    @staticmethod
    def _marker(intent: Intent) -> bytes:
        # The exact intent, not just its id: a marker left by a deleted and recreated
        # pipeline, or a torn write, never matches.
        return (json.dumps({"batch": intent.batch_id, "writer": intent.writer,
                            "planned_at": intent.planned_at.isoformat()}) + "\n").encode()

    def _append(self, df: DataFrame, path: str, intent: Intent, *, partition_by: tuple[str, ...],
                observation: Observation | None = None) -> bool:
        """Append with the batch's txn; True if this append committed, False if the batch was there.

        An ``observation`` on ``df`` that completes proves the write ran its job, and a
        write that ran and returned has committed; otherwise history decides.
        """
        token = uuid.uuid4().hex
        writer = (df.write.format("delta").mode("append")
                  .option("txnAppId", self.pipeline).option("txnVersion", intent.batch_id)
                  .option("userMetadata", intent.to_json(write=token)).options(**self.table_properties))
        if path == self.target:
            writer = writer.options(**self.source.write_options())
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        try:
            writer.save(path)
        except _DELTA_CONFLICTS:
            # A rival run committed the same batch (identical rows) first.
            if self.committed_batch(path) < intent.batch_id:
                raise
            return False
        if observation is not None and _completes(observation, OBSERVATION_WAIT_SECONDS):
            return True
        return self._landed(path, intent, token)

    # -- the whole batch ------------------------------------------------------------

    def run_batch(self, bounds: Mapping[TP, PartitionBounds]) -> tuple[BatchResult | None, BatchResult | None]:
        """Steps 1-5 up to ``bounds`` (a snapshot of the LSOs), within the source's caps. Returns
        (the replay of the last batch if one ran, the new batch or None)."""
        source = self.source
        max_offsets, max_bytes = source.max_records, source.max_bytes
        self._limits = _Limits(bounds, max_offsets, max_bytes)
        # Step 1. Recover.
        last, replay = self.recover()
        self._reached("recovered")

        # Step 2. Plan N+1.
        previous = last.ends() if last else {}
        fresh = [tp for tp in bounds if tp not in previous]
        starts = source.new_starts(fresh, bounds, last is not None) if fresh else {}
        next_id = (last.batch_id if last else 0) + 1
        weights: Mapping[TP, float] | None = None
        if max_bytes is not None:
            # Only readable starts: one below the log start is the planner's to report (retention loss).
            readable = {tp: (previous.get(tp, starts.get(tp, b.stable_end)), b.stable_end) for tp, b in bounds.items()}
            weights = source.sizes({tp: r for tp, r in readable.items() if r[0] >= bounds[tp].log_start})
        self._limits = replace(self._limits, weights=weights)
        intent = self._plan(next_id, last, bounds, starts, max_offsets, max_bytes, weights)
        if intent.is_empty and set(bounds) <= set(previous) and not intent.starts_waiting(last):
            return replay, None
        self._reached("planned")

        try:
            return replay, self._claim_and_write(intent)
        except ConcurrentWriterError:
            winner = self.ledger.get(intent.batch_id)
            if winner is None or winner.seek is None:
                raise
            # An operator's seek holds the batch: nothing of ours was written. The next
            # call recovers from the seek (its empty batch) and goes on from its offsets.
            self._settled = None
            log.warning("batch %d is an operator's seek (%s): going on from its offsets", intent.batch_id,
                        winner.seek.reason)
            return replay, None

    def _plan(self, batch_id: int, last: Intent | None, bounds: Mapping[TP, PartitionBounds],
              starts: Mapping[TP, int], max_offsets: int, max_bytes: int | None = None,
              weights: Mapping[TP, float] | None = None, decide: _Decide | None = None) -> Intent:
        """Step 2: ranges within the cap, then the pipeline's decisions (``decide``, default the pipeline's).

        If the cut leaves nothing, a source transaction is larger than the caps let a
        batch be: the caps grow fourfold until one fits whole, so a big transaction does
        not stall the pipeline; only one incomplete in Kafka waits. Each try is a scan,
        hence the steep growth, and its hard limit: :data:`MAX_GROWTH` times the cap (or
        everything readable, if less). Past it, a batch held back only by a transaction
        waiting for missing events stays empty (the wait is the reason); one held back by
        sheer size stops the run with :class:`BatchLimitError`, never a batch without bound.

        If a cut keeps less than half the record cap, the proposal doubles (up to
        :data:`FILL_GROWTH` times; not under a byte cap, which the estimate alone keeps) while
        its cut still fits the cap: a cap split evenly over
        partitions that fill at different rates ends them at different moments, and the cut
        falls back to the earliest, so a small cap would otherwise land a fraction of itself
        per batch. Ends only grow with the proposal, so the largest cut that fits is kept.
        """
        planned_at = now_utc()
        previous = last.ends() if last else {}
        decide = decide or self.source.decide
        cap, byte_cap = max_offsets, max_bytes
        fits: Intent | None = None
        """The largest non-empty cut within the caps so far (the fill growth's fallback)."""
        while True:
            ranges = plan_ranges(previous, bounds, starts, cap, max_bytes=byte_cap, bytes_per_offset=weights)
            intent = Intent(self.pipeline, batch_id, self.writer_id, planned_at, ranges)
            if intent.is_empty:
                return intent
            decided = decide(intent, last, bounds)
            readable = sum(b.stable_end - (previous[tp] if tp in previous else starts[tp])
                           for tp, b in bounds.items())
            everything = cap >= readable and byte_cap is None
            if not decided.is_empty:
                size = _offsets(decided)
                if fits is not None and size > max_offsets:
                    return fits
                thin = size * 2 < max_offsets and size < _offsets(intent)  # the cut took much of a full proposal
                if everything or not thin or max_bytes is not None or fits is None and cap > max_offsets \
                        or cap >= max_offsets * FILL_GROWTH:
                    return decided
                fits, cap = decided, cap * 2
                continue
            if everything:
                return decided
            if cap >= max_offsets * MAX_GROWTH:
                if decided.waiting:
                    return decided
                raise BatchLimitError(
                    f"pipeline {self.pipeline!r}, batch {batch_id}: no source transaction fits whole in {cap:,} "
                    f"offsets ({MAX_GROWTH}x max_records_per_batch) past the last batch's ends: one spans more "
                    "than that. Nothing was written. Raise max_records_per_batch (or max_bytes_per_batch) for "
                    "this pipeline (docs/reference/configuration.md, 'pipelines[]': max_records_per_batch, max_bytes_per_batch)")
            cap *= 4
            byte_cap = None if byte_cap is None or cap >= readable else byte_cap * 4

    def run_intent(self, planned: Intent) -> tuple[BatchResult | None, BatchResult | None]:
        """Steps 1 and 3-5 for a batch planned elsewhere: a backfill of a stored batch's exact ranges.

        The batch keeps its id (``txnVersion``), so ids must be fed in increasing order;
        an id the target already holds is skipped, which makes a re-run resume.
        """
        self._limits = None
        last, replay = self.recover()
        self._reached("recovered")
        if last is not None and planned.batch_id <= last.batch_id:
            return replay, None
        return replay, self._claim_and_write(replace(planned, writer=self.writer_id))

    def _claim_and_write(self, intent: Intent) -> BatchResult:
        # Step 3. Claim the batch, then confirm the claim is ours: an append that ran its
        # job and returned has committed (as in step 4); otherwise history decides.
        from pyspark.sql import Observation

        token = uuid.uuid4().hex
        seen = Observation(f"tidemark-claim-{self.pipeline}-{intent.batch_id}-{token[:8]}")
        with ThreadPoolExecutor(1, thread_name_prefix="tidemark-prepare") as pool:
            # Step 4's pass is analysed on the driver while the claim's Delta commit runs:
            # building it has no side effect, and it runs only once the claim is ours.
            prepared = pool.submit(self._prepare, intent)
            try:
                committed = self.ledger.append(intent, write=token, observation=seen)
                claimed = committed if committed is not None else (
                    _completes(seen, OBSERVATION_WAIT_SECONDS) or self._landed(self.ledger.path, intent, token))
            except _DELTA_CONFLICTS:
                # A rival committed first; history says who owns the batch.
                claimed = self._landed(self.ledger.path, intent, token)
            step = prepared.result() if claimed else None
        if not claimed:
            owner = self.ledger.get(intent.batch_id)
            raise ConcurrentWriterError(
                f"pipeline {self.pipeline!r}: batch {intent.batch_id} was claimed by another run "
                f"(writer {owner.writer[:8] if owner else '?'}); only one ingest per pipeline may run")
        self._reached("claimed")

        # Steps 4 and 5. Commit rows and offsets together, then settle the quarantine.
        result = self._write(intent, replayed=False, prepared=step)
        self._mark_settled(result.intent)
        self._reached("quarantined")
        self._checkpoint(result)                                               # step 6
        self._warm()
        return result

    def _warm(self) -> None:
        """After step 6: the target's snapshot state for the next append (:func:`offsets.tables.warm_snapshot`).

        Housekeeping, like step 6, and read-only: a failure only logs, a crash loses nothing.
        One at a time; the next append's ``txnAppId`` check waits for a computation in flight
        (a Scala lazy value) instead of running its own.
        """
        if not self.source.keep_warm or (self._warming is not None and self._warming.is_alive()):
            return

        def warm() -> None:
            try:
                version = warm_snapshot(self.spark, self.target)
                log.debug("warmed %s's snapshot at version %d", self.target, version)
            except Exception as exc:  # noqa: BLE001 - the next append computes it instead
                log.debug("warming %s's snapshot failed (%s); the next append computes it", self.target, exc)

        from pyspark import InheritableThread

        # Inheritable: its jobs carry this thread's job group and pool (serve cancels a run's group).
        self._warming = InheritableThread(target=warm, daemon=True, name=f"warm-{self.pipeline}")
        self._warming.start()

    def quiesce(self, timeout: float = 60.0) -> None:
        """Wait for a warm-up in flight, so a session stopped next does not cancel its Spark jobs under it."""
        if self._warming is not None:
            self._warming.join(timeout)

    def _checkpoint(self, result: BatchResult) -> None:
        """Step 6: checkpoint each table ``result``'s batch committed to, when due."""
        if self.checkpoint_every is None:
            return
        for path in (self.target, self.ledger.path, *((self.quarantine,) if result.quarantined else ())):
            try:
                version = checkpoint_if_due(path, self.checkpoint_every)
            except Exception as exc:  # noqa: BLE001 - housekeeping: the batch is committed either way
                log.warning("checkpoint of %s failed (%s); Spark checkpoints it at its own interval", path, exc)
                continue
            if version is not None:
                log.debug("checkpointed %s at version %d", path, version)
        self._reached("checkpointed")
