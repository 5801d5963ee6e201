"""The one seam between the commit protocol and the pipelines that feed it.

The protocol (``offsets.protocol``) owns the steps that matter for exactly-once; a pipeline
(``pipelines.ingest``, which backfill and seek run through) owns what a batch's records
become. They meet here, and only here: :class:`BatchSource` is the pipeline's side of every
batch, one object handed to the protocol once; the frames it builds for an intent, the
guard a G3 write checks and the result each batch reports are what passes through it.
Kept apart from the protocol's steps so that a pipeline's modules name these without
reaching into them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from offsets.ledger import TP, Intent

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from connectors.admin import PartitionBounds

#: Starts the message a guarded write fails with when its check flags a record.
GUARD_TRIPPED = "tidemark-guard-tripped: "

#: Column of :attr:`BatchFrames.records` holding why a record is bad (null when it is good).
ERROR_COLUMN = "_tidemark_error"


@dataclass(frozen=True)
class Guard:
    """A guarded write's check, over ``records``: ``tripped`` is true for a record the intent
    may not hold uncut (never null); ``why`` says why, read only where ``tripped``.

    Two columns, not one message that is null where all is well: Spark copied a nullable
    message's test (and the expressions inside it) into each place the write's filter used
    it, tripling the generated code of the write's stage (docs/benchmarks.md, "A guard as
    two columns").
    """

    tripped: Column
    why: Column


@dataclass(frozen=True)
class BatchFrames:
    """What a batch writes, from one read of its ranges.

    ``read`` is every record of the batch, once, as Kafka gives it plus what the pipeline
    computes per record before any decision (the parse); ``check`` turns a frame of that
    shape into :attr:`records`, with :data:`ERROR_COLUMN`; ``good`` and ``bad`` project
    records to target rows and quarantine rows. Keeping the steps apart lets step 4 count
    the records read (observed on ``read``) and the rows written (observed on ``good``) in
    the pass that writes, on rows Spark holds anyway: counting copies none. The first
    count also stops Spark from pushing the good/bad filter below the parse, which would
    repeat the parse inside the filter.
    """

    read: DataFrame
    check: Callable[[DataFrame, Guard | None], DataFrame]
    """With a guard, :data:`ERROR_COLUMN` is :func:`guarded_error` of it, in the same projection
    (each projection added to the pass is analysed again: 0.02 s of a G3 batch's step 3)."""
    good: Callable[[DataFrame], DataFrame]
    bad: Callable[[DataFrame], DataFrame]
    guard: Guard | None = None
    """Over ``read``: where a guarded intent may not write a record uncut, and why."""

    @property
    def records(self) -> DataFrame:
        return self.check(self.read, None)


def guarded_error(guard: Guard, error: Column) -> Column:
    """:data:`ERROR_COLUMN` of a guarded write: the job fails at the first record ``guard``
    trips, so nothing commits; else ``error``. Every record's error is evaluated (the
    good/bad split needs it), so every record is checked, a bad one too."""
    from pyspark.sql import functions as F

    return F.when(guard.tripped, F.raise_error(F.concat(F.lit(GUARD_TRIPPED), guard.why))).otherwise(error)


@dataclass(frozen=True)
class BatchResult:
    intent: Intent
    replayed: bool
    rows: int
    """Rows this run appended to the target (0 when Delta found the batch already there)."""
    quarantined: int
    """Records this run appended to quarantine."""


class BatchSource(Protocol):
    """The pipeline's side of a batch, in the order the protocol's steps ask for it.

    Step 2 plans from :attr:`max_records` and :attr:`max_bytes`, the starts of partitions
    without a stored end (:meth:`new_starts`) and the bytes per offset (:meth:`sizes`), then
    lets :meth:`decide` fix what a replay must repeat. Step 4 writes :meth:`frames` with
    :meth:`write_options`, and revises a guarded batch whose check failed by :meth:`revise`.
    Every method must be deterministic in the intent it is given: a replay rebuilds the same
    batch from the ledger alone.
    """

    keep_warm: bool
    """The session outlives this batch (``--follow``, ``serve``): after step 6 the protocol
    computes the target's new snapshot state on a thread, off the next batch's commit path."""

    @property
    def max_records(self) -> int:
        """The record cap of a batch (step 2 may grow it to take a source transaction whole)."""

    @property
    def max_bytes(self) -> int | None:
        """The byte cap of a batch, estimated by :meth:`sizes`; None: none."""

    def new_starts(self, partitions: list[TP], bounds: Mapping[TP, PartitionBounds],
                   known: bool) -> Mapping[TP, int]:
        """Where ``partitions`` (no stored end) start, within ``bounds`` (the snapshot the batch
        is planned to); ``known``: the pipeline has committed a batch before, so they are new to
        a running pipeline, not its first start."""

    def sizes(self, ranges: Mapping[TP, tuple[int, int]]) -> Mapping[TP, float]:
        """Bytes per offset of each partition's ``(start, end)``, for a byte cap."""

    def decide(self, intent: Intent, last: Intent | None, bounds: Mapping[TP, PartitionBounds]) -> Intent:
        """Step 2's second half: the planned ``intent`` with the pipeline's decisions made (it may
        shrink the ranges, or mark the intent guarded), given the batch before and the bounds."""

    def revise(self, proposal: Intent, last: Intent | None,
               bounds: Mapping[TP, PartitionBounds] | None) -> Intent:
        """Step 4's revision of a guarded intent whose check failed: ``proposal`` (its ranges
        planned again from the same starts, its other decisions kept) decided without the
        guard; ``bounds`` None: the pipeline's own snapshot, now."""

    def frames(self, intent: Intent) -> BatchFrames:
        """What ``intent``'s batch writes, from one read of its ranges."""

    def write_options(self) -> Mapping[str, str]:
        """Writer options of step 4's append to the target only (``mergeSchema`` when the batch
        adds or widens columns, so the new schema lands in the batch's own commit)."""

    def reached(self, step: str) -> None:
        """Told each named step as it is reached (the crash points' names): timing, never control."""
