"""What the commit protocol and the pipelines that feed it exchange about one batch.

The protocol (``offsets.protocol``) owns the steps that matter for exactly-once; a pipeline
(``pipelines.ingest``, ``pipelines.backfill``) owns what a batch's records become. They meet
here: the frames a pipeline builds for an intent, the guard a G3 write checks, the
decisions it makes in step 2, and the result each batch reports. Kept apart from the
protocol's steps so that a pipeline's modules name these without reaching into them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    it, which tripled the generated code of the write's stage (1.6 → 4.9 KB of bytecode
    in its main loop) and cost G3 more than the check itself (measured on 2 cores).
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


#: Builds a batch's frames from its intent; must be deterministic in the intent.
FrameBuilder = Callable[[Intent], BatchFrames]

#: Step 2's second half: a planned intent, the batch before it and the partitions' bounds
#: (LSOs) it was planned to, to the intent with the pipeline's decisions made (may shrink
#: its ranges, or mark it guarded).
Decide = Callable[[Intent, "Intent | None", Mapping[TP, "PartitionBounds"]], Intent]

#: Step 4's revision of a guarded intent whose check failed: a proposal for the same batch (its
#: ranges re-planned from the same starts, the guarded intent's other decisions kept), the batch
#: before it and the bounds it is planned to (None: the pipeline's own snapshot, now), to the
#: proposal decided without the guard: cut by the planning scan.
Revise = Callable[[Intent, "Intent | None", "Mapping[TP, PartitionBounds] | None"], Intent]

#: Where partitions without a stored end start: given them, the bounds the batch is planned
#: to, and whether the pipeline has committed a batch before (then they are new to a
#: running pipeline, not its first start). Every start must lie within those bounds.
NewPartitionStarts = Callable[[list[TP], Mapping[TP, "PartitionBounds"], bool], Mapping[TP, int]]
