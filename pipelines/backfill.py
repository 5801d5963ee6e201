"""``tidemark backfill``: re-read Kafka into another Delta table, exactly once, resumable.

Two ways to say what to re-read:

* **stored batches** (``--batches 3-7``): the exact ``[start, end)`` ranges the pipeline's
  ledger recorded for those batches, with their batch ids and ``planned_at``, so the rows
  equal the ones the pipeline wrote (G6) — useful to rebuild a table, or to re-derive it
  with a new schema;
* **a start position** (``--from-offsets`` or ``--from-timestamp``): every record from
  there up to the LSO at the time of the run, in batches within the pipeline's caps.

A backfill target is a pipeline table of its own (its own ledger and quarantine), written
through the same commit protocol, so a crashed or interrupted backfill resumes where it
stopped when run again. Records that retention already deleted stop the backfill with
:class:`RetentionLossError` before anything of the affected batch is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from connectors.admin import TP, KafkaAdmin, PartitionBounds, RetentionLossError, check_retention
from offsets.frames import BatchResult
from offsets.ledger import Intent, Ledger
from pipelines.ingest import IngestJob, IngestReport
from tidemark.config import PipelineConfig, TidemarkConfig, TimestampStart
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_HINT = ("The backfill stopped before that batch; pick later batches or a later --from-offsets/--from-timestamp, "
         "or restore the topic's data")


def parse_batches(text: str) -> tuple[int, int]:
    """``7`` or ``3-7`` → (first, last)."""
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise ConfigError(f"--batches {text!r}: expected a batch id or a range like 3-7") from None
    if lo < 1 or hi < lo:
        raise ConfigError(f"--batches {text!r}: expected 1 <= first <= last")
    return lo, hi


def parse_offsets(text: str) -> dict[TP, int]:
    """``orders:0=120,orders:1=88`` → {(orders, 0): 120, (orders, 1): 88}."""
    result: dict[TP, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        where, sep, offset = item.rpartition("=")
        topic, colon, partition = where.rpartition(":")
        try:
            if not (sep and colon and topic):
                raise ValueError
            result[(topic, int(partition))] = int(offset)
        except ValueError:
            raise ConfigError(f"--from-offsets: {item!r} is not TOPIC:PARTITION=OFFSET, "
                              "e.g. orders:0=120,orders:1=88") from None
    if not result:
        raise ConfigError("--from-offsets: give TOPIC:PARTITION=OFFSET for each partition, e.g. orders:0=120")
    return result


class Backfill:
    def __init__(self, spark: SparkSession, config: TidemarkConfig, pipeline: PipelineConfig, bootstrap: str,
                 into: str) -> None:
        own = {pipeline.target, pipeline.quarantine_path, pipeline.ledger_path}
        if into.rstrip("/") in {p.rstrip("/") for p in own}:
            raise ConfigError(f"backfill target {into} is one of pipeline {pipeline.name!r}'s own tables; "
                              "backfill into a new path (then swap tables if that is the goal)")
        self.spark = spark
        self.config = config
        self.source = pipeline
        self.bootstrap = bootstrap
        self.into = into
        self.on_batch: Callable[[BatchResult, float], None] | None = None
        """Called after each batch written (a progress bar); a stored batch's seconds are its own."""

    def _job(self, start: PipelineConfig | None = None, start_offsets: Mapping[TP, int] | None = None,
             dedup_table: str | None = None) -> IngestJob:
        target = (start or self.source).model_copy(update={"target": self.into, "quarantine": None})
        job = IngestJob(self.spark, self.config, target, self.bootstrap, start_offsets=start_offsets,
                        dedup_table=dedup_table)
        job.on_batch = self.on_batch
        return job

    def stored_batches(self, first: int, last: int) -> IngestReport:
        intents = Ledger(self.spark, self.source.ledger_path, self.source.name).history(first, last)
        if not intents:
            raise ConfigError(f"pipeline {self.source.name!r} has no batches {first}-{last} in its ledger; "
                              f"`tidemark offsets show {self.source.name}` lists them")
        found = {i.batch_id for i in intents}
        missing = [b for b in range(first, last + 1) if b not in found]
        if missing:
            log.warning("batches not in the ledger, skipped: %s", missing)
        # A stored batch's dedup decisions name a version of the pipeline's own table.
        self._check_dedup_versions(intents)
        job = self._job(dedup_table=self.source.target)
        job.evolve_schema()  # as a run's first batch does (pipelines.evolution)
        report = IngestReport()
        with KafkaAdmin(job.client_config) as admin:
            for intent in intents:
                starts = {r.tp: r.start for r in intent.ranges if r.span}
                try:
                    check_retention(starts, admin.bounds(starts))
                except RetentionLossError as exc:
                    raise RetentionLossError(exc.losses, context=f" (batch {intent.batch_id})", hint=_HINT) from None
                started = time.monotonic()
                replay, result = job.protocol.run_intent(intent)
                done = [b for b in (replay, result) if b is not None]
                report.batches += done
                if self.on_batch is not None and done:
                    self.on_batch(done[-1], time.monotonic() - started)
        return report

    def _check_dedup_versions(self, intents: list[Intent]) -> None:
        """Refuse stored batches whose dedup looked up a table version VACUUM has deleted (not reproducible)."""
        from pipelines.maintain import readable_from

        if self.source.dedup is None:
            return
        oldest = readable_from(self.source, "target", self.source.target) or 0
        gone = [i.batch_id for i in intents if i.dedup_version is not None and 0 <= i.dedup_version < oldest]
        if gone:
            raise ConfigError(
                f"batches {gone[0]}-{gone[-1]} of pipeline {self.source.name!r} looked up duplicates in versions of "
                f"{self.source.target} older than {oldest}, the oldest VACUUM kept (maintenance.time_travel_hours "
                f"{self.source.maintenance.time_travel_hours:g}), so they cannot be reproduced bit for bit. Nothing was "
                f"written. Backfill later batches, or re-read these with --from-offsets (dedup against the new table)")

    def from_offsets(self, offsets: Mapping[TP, int]) -> IngestReport:
        job = self._job(start_offsets=offsets)
        snapshot = job.snapshot()
        unknown = sorted(set(offsets) - set(snapshot))
        if unknown:
            raise ConfigError(f"--from-offsets names partitions the pipeline does not read: {unknown}")
        return self._run(job, snapshot)

    def from_timestamp(self, when: datetime) -> IngestReport:
        start = self.source.model_copy(update={"start": TimestampStart(timestamp=when)})
        job = self._job(start)
        return self._run(job, job.snapshot())

    def _run(self, job: IngestJob, snapshot: Mapping[TP, PartitionBounds]) -> IngestReport:
        try:
            return job.run_to(snapshot)
        except RetentionLossError as exc:
            raise RetentionLossError(exc.losses, hint=_HINT) from None
