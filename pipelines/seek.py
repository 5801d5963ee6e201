"""``tidemark offsets seek``: move a running pipeline to chosen offsets, exactly once and on the record.

A topic deleted and recreated, records lost to retention, a bug to re-ingest from: each
needs the pipeline to go on from other offsets under its own name, its own fence and its
own ledger history. A seek is therefore a batch like any other: the commit protocol's
steps 1 and 3-5 (:meth:`offsets.protocol.CommitProtocol.run_intent`) on an intent whose
ranges are empty and whose ends are the new offsets. So:

1. **Recover** first, as any run does: a batch left half-done by a crash is finished
   before the offsets move (a seek past an uncommitted batch would lose it).
2. **Plan** the move (:func:`plan_moves`, no I/O): each partition in scope from where the
   pipeline has reached to its new offset, within the partition's log. Backwards (read
   again what the table holds) needs ``reprocess``; forwards (pass records over) needs
   ``skip``. With G3, a new offset inside a source transaction moves back to the
   transaction's first event, so no transaction is split by the seek.
3. **Claim** batch ``N+1`` as the seek, under the same fence as every claim. A rival run
   that claims ``N+1`` first wins, and the seek plans again from its batch. A follower
   whose next claim meets the seek drops that batch (nothing of it was written) and goes
   on from the seek's offsets.
4. **Commit** its empty batch to the target with ``txnVersion=N+1``, and settle it. A
   crash anywhere leaves the old offsets (no claim) or the new ones (the claim, replayed
   by the next run as any batch is): one Delta commit holds every partition's move.

The ledger keeps the seek's moves (:class:`offsets.ledger.Seek`): ``tidemark offsets
show`` lists it, and ``tidemark check`` reconciles skipped ranges as the operator's, not
as missing records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from connectors.admin import TP, KafkaAdmin, PartitionBounds
from offsets.ledger import Intent, Move, Range, Seek, now_utc
from offsets.protocol import ConcurrentWriterError
from tidemark.errors import ConfigError, TransientError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tidemark.config import PipelineConfig, TidemarkConfig

log = logging.getLogger(__name__)

#: How many times a seek plans again when a running follower claims the batch first.
CLAIM_ATTEMPTS = 5


@dataclass(frozen=True)
class Target:
    """Where to move: the log's start or end, a time, explicit offsets, or a shift."""

    kind: Literal["earliest", "latest", "timestamp", "offsets", "shift"]
    timestamp: datetime | None = None
    offsets: Mapping[TP, int] | None = None
    shift: int = 0

    def describe(self) -> str:
        if self.kind in ("earliest", "latest"):
            return f"--to {self.kind}"
        if self.kind == "timestamp":
            assert self.timestamp is not None
            return f"--to-timestamp {self.timestamp.isoformat()}"
        if self.kind == "shift":
            return f"--shift-by {self.shift}"
        assert self.offsets is not None
        return "--to " + ",".join(f"{t}:{p}={o}" for (t, p), o in sorted(self.offsets.items()))


@dataclass(frozen=True)
class Planned:
    """One partition's move, with what it means for the records between its two offsets."""

    move: Move
    bounds: PartitionBounds
    edge: int | None = None
    """The offset asked for, when G3 moved it back to a source transaction's first event."""

    @property
    def past_end(self) -> bool:
        """The old offset lies beyond the partition's end: the topic was deleted and recreated."""
        return self.move.old is not None and self.move.old > self.bounds.stable_end

    @property
    def reread(self) -> int:
        """Offsets the pipeline reads a second time (records it already holds, and markers)."""
        old = self.move.old
        return 0 if old is None or self.past_end or self.move.new >= old else min(old, self.bounds.stable_end) - self.move.new

    @property
    def skipped(self) -> int:
        old = self.move.old
        return 0 if old is None or self.move.new <= old else self.move.new - old

    @property
    def lost(self) -> int:
        """Of the skipped offsets, those retention had deleted already."""
        old = self.move.old
        return 0 if old is None or self.move.new <= old else max(0, min(self.move.new, self.bounds.log_start) - old)


@dataclass(frozen=True)
class SeekPlan:
    pipeline: str
    batch_id: int
    target: Target
    planned: tuple[Planned, ...]
    committed: bool = False

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(p.move for p in self.planned if p.move.old != p.move.new)

    @property
    def reread(self) -> int:
        return sum(p.reread for p in self.planned)

    @property
    def skipped(self) -> int:
        return sum(p.skipped for p in self.planned)

    def needs(self) -> list[str]:
        """The flags this plan needs to be carried out."""
        return [flag for flag, needed in (("--reprocess", self.reread), ("--skip", self.skipped)) if needed]

    def lines(self) -> list[str]:
        """The plan for people: one line per partition that moves."""
        out = []
        for p in sorted(self.planned, key=lambda p: p.move):
            m = p.move
            if m.old == m.new:
                continue
            where = f"{m.topic}[{m.partition}]"
            old = "nothing read yet" if m.old is None else str(m.old)
            note = ""
            if p.past_end:
                note = f" (the old offset is past the partition's end {p.bounds.stable_end}: the topic was recreated)"
            elif p.reread:
                note = f" ({p.reread:,} offsets read again)"
            elif p.skipped:
                note = f" ({p.skipped:,} offsets skipped" + (f", {p.lost:,} of them deleted by retention" if p.lost
                                                              else "") + ")"
            if p.edge is not None:
                note += f" (asked {p.edge}: moved back to the first event of a source transaction across it)"
            out.append(f"{where}: {old} -> {m.new}{note}")
        return out


def parse_offsets(spec: str) -> dict[TP, int]:
    """``TOPIC:PARTITION=OFFSET,...`` as a mapping; a clear error for anything else."""
    found: dict[TP, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            where, offset = part.rsplit("=", 1)
            topic, partition = where.rsplit(":", 1)
            found[(topic, int(partition))] = int(offset)
        except ValueError:
            raise ConfigError(f"--to {spec!r}: give earliest, latest, or TOPIC:PARTITION=OFFSET,... "
                              f"(e.g. orders:0=1200,orders:1=950); {part!r} is none of those") from None
    return found


def in_scope(tp: TP, topics: Iterable[str], partitions: Iterable[TP]) -> bool:
    topics, partitions = set(topics), set(partitions)
    return (not topics and not partitions) or tp[0] in topics or tp in partitions


def plan_moves(ends: Mapping[TP, int], bounds: Mapping[TP, PartitionBounds], target: Target,
               scope: Iterable[TP], found_for_time: Mapping[TP, int] | None = None) -> dict[TP, Move]:
    """Each partition in ``scope`` from where the pipeline reached (``ends``) to its new offset; pure.

    New offsets stay inside the partition's readable log, ``[log start, LSO]``: a seek past
    the end would wait for records that may never come, one below the start would meet
    retention at once.
    """
    moves: dict[TP, Move] = {}
    for tp in sorted(scope):
        b = bounds[tp]
        old = ends.get(tp)
        if target.kind == "earliest":
            new = b.log_start
        elif target.kind == "latest":
            new = b.stable_end
        elif target.kind == "timestamp":
            assert found_for_time is not None
            new = found_for_time[tp]
        elif target.kind == "shift":
            base = b.log_start if old is None else min(old, b.stable_end)
            new = base + target.shift
        else:
            assert target.offsets is not None
            if tp not in target.offsets:
                continue
            new = target.offsets[tp]
            if not b.log_start <= new <= b.stable_end:
                raise ConfigError(f"{tp[0]}[{tp[1]}]: offset {new} is outside the partition's readable log "
                                  f"[{b.log_start}, {b.stable_end}]; choose one inside it")
        moves[tp] = Move(tp[0], tp[1], old, max(b.log_start, min(new, b.stable_end)))
    return moves


def check_allowed(plan: SeekPlan, *, reprocess: bool, skip: bool) -> None:
    """Refuse a move the operator did not allow, saying how many records it would touch."""
    reread = [p for p in plan.planned if p.reread]
    if reread and not reprocess:
        raise ConfigError(
            f"the seek moves {len(reread)} partition(s) back: {plan.reread:,} offsets would be read again "
            f"({', '.join(f'{p.move.topic}[{p.move.partition}]' for p in reread)}). Add --reprocess to do it "
            "(with dedup, the records read again are quarantined as duplicates); --dry-run shows the plan")
    skipped = [p for p in plan.planned if p.skipped]
    if skipped and not skip:
        raise ConfigError(
            f"the seek moves {len(skipped)} partition(s) forwards: {plan.skipped:,} offsets would never be read "
            f"({', '.join(f'{p.move.topic}[{p.move.partition}]' for p in skipped)}). Add --skip to do it (the "
            "ledger records the skipped ranges; `tidemark check` reports them as skipped); --dry-run shows the plan")


class SeekError(TransientError):
    """The pipeline's batches kept moving under the seek: every claim it made was taken first."""


def seek(spark: SparkSession, config: TidemarkConfig, pipeline: PipelineConfig, bootstrap: str, target: Target,
         *, topics: Iterable[str] = (), partitions: Iterable[TP] = (), reprocess: bool = False, skip: bool = False,
         dry_run: bool = False) -> SeekPlan:
    """Steps 1-4 of the module's docstring; with ``dry_run`` only 1-2 (nothing written but a recovery),
    whatever flags the plan would need (:meth:`SeekPlan.needs` says which)."""
    from pipelines.ingest import IngestJob
    from pipelines.transactions.starts import whole_starts

    job = IngestJob(spark, config, pipeline, bootstrap)
    known_topics = set(topics)
    for attempt in range(1, CLAIM_ATTEMPTS + 1):
        last, _ = job.protocol.recover()                                                   # step 1
        bounds = job.snapshot()
        unknown = sorted(known_topics - {t for t, _ in bounds})
        if unknown:
            raise ConfigError(f"pipeline {pipeline.name!r} reads no topic {', '.join(map(repr, unknown))}; "
                              f"its partitions: {', '.join(sorted({t for t, _ in bounds}))}")
        ends = last.ends() if last else {}
        scope = [tp for tp in bounds if in_scope(tp, topics, partitions)]
        if not scope:
            raise ConfigError("no partition of the pipeline is in the seek's scope; check --topic and --partition")
        found = None
        if target.kind == "timestamp":
            assert target.timestamp is not None
            with KafkaAdmin(job.client_config) as admin:
                found = admin.offsets_for_time(scope, target.timestamp)
        moves = plan_moves(ends, bounds, target, scope, found)                             # step 2
        edges: dict[TP, int] = {}
        if pipeline.transactions.atomic:
            asked = {tp: m.new for tp, m in moves.items() if m.new != m.old and m.new < bounds[tp].stable_end}
            whole = whole_starts(job.client_config, pipeline, asked, bounds) if asked else {}
            for tp, offset in whole.items():
                if offset != asked[tp]:
                    edges[tp] = asked[tp]
                    moves[tp] = Move(tp[0], tp[1], moves[tp].old, offset)
        batch_id = (last.batch_id if last else 0) + 1
        plan = SeekPlan(pipeline.name, batch_id, target,
                        tuple(Planned(m, bounds[tp], edges.get(tp)) for tp, m in sorted(moves.items())))
        if not plan.moves or dry_run:
            return plan
        check_allowed(plan, reprocess=reprocess, skip=skip)
        landing = {**ends, **{tp: m.new for tp, m in moves.items()}}
        intent = Intent(pipeline.name, batch_id, job.protocol.writer_id, now_utc(),
                        tuple(sorted(Range(t, p, o, o) for (t, p), o in landing.items())),
                        seek=Seek(plan.moves, target.describe()))
        try:
            _, done = job.protocol.run_intent(intent)                                       # steps 3-4
        except ConcurrentWriterError:
            done = None
        if done is not None:
            return SeekPlan(plan.pipeline, plan.batch_id, plan.target, plan.planned, committed=True)
        log.warning("batch %d was claimed by a running ingest before the seek (attempt %d of %d); planning again",
                    batch_id, attempt, CLAIM_ATTEMPTS)
    raise SeekError(f"pipeline {pipeline.name!r}: a running ingest claimed each batch the seek tried to claim "
                    f"({CLAIM_ATTEMPTS} times); run the seek again (the pipeline's offsets did not move)")
