"""The Spark work of each orchestrated run, as plain functions of a SparkSession.

One place for it, so the two ways a run gets a session do the same work: a flow run in
its own process uses its own session (:func:`orchestration.flows.spark_session`), and a
run under ``tidemark serve`` hands the call to the serve process's warm driver
(:mod:`orchestration.driver`), which calls the very same function on its session.

Arguments and results are plain data (strings, numbers, dicts): they cross a process
boundary under ``serve``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestration.context import pipeline_context
from tidemark.errors import TerminalError
from tidemark.settings import settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from offsets.frames import BatchResult


def ingest(spark: SparkSession, config: str, pipeline: str,
           on_batch: Callable[[BatchResult, float], None] | None = None, keep_warm: bool = False) -> dict[str, Any]:
    """A bounded ingest up to the LSO; ``fetching_at`` is when its first batch started planning.

    Every Kafka fetch of a run (the size sample, the G3 read, the write's pass) comes at
    or after that instant, so ``fetching_at`` minus the run's start bounds from below
    what the run spent before it read anything: process, session, config, Prefect slot,
    the LSO snapshot and the ledger's recovery. ``keep_warm``: the session outlives the run
    (``serve``), so each batch leaves the target's snapshot state computed for the next.
    """
    from offsets.lag import partition_lags
    from offsets.ledger import Ledger
    from pipelines.ingest import IngestJob

    ctx = pipeline_context(config, pipeline)
    job = IngestJob(spark, ctx.config, ctx.pipeline, ctx.bootstrap)
    job.on_batch = on_batch  # serve's metrics, when the warm driver runs it
    job.keep_warm = keep_warm
    try:
        report = job.run_bounded()
    finally:
        job.protocol.quiesce()  # the warm-up is this run's work: none outlives it
    advanced = sum(r.span for b in report.batches if not b.replayed for r in b.intent.ranges)
    last = Ledger(spark, ctx.pipeline.ledger_path, pipeline).last()
    lags = partition_lags(ctx.client_config, ctx.pipeline, last.ends() if last else {})
    return {"batches": len(report.batches), "rows": report.rows, "quarantined": report.quarantined,
            "offsets_advanced": advanced, "held_transactions": sum(b.intent.held for b in report.batches),
            "replayed": sum(1 for b in report.batches if b.replayed),
            "lag": sum(x.lag for x in lags), "fetching_at": job.fetching_at,
            "partitions": [{"topic": x.topic, "partition": x.partition, "next_offset": x.next_offset,
                            "lso": x.lso, "lag": x.lag} for x in lags]}


def backfill(spark: SparkSession, config: str, pipeline: str, into: str, batches: str | None,
             from_offsets: str | None, from_timestamp: str | None) -> dict[str, Any]:
    from pipelines.backfill import Backfill, parse_batches, parse_offsets
    from tidemark.config import TimestampStart

    ctx = pipeline_context(config, pipeline)
    job = Backfill(spark, ctx.config, ctx.pipeline, ctx.bootstrap, into)
    if batches:
        report = job.stored_batches(*parse_batches(batches))
    elif from_offsets:
        report = job.from_offsets(parse_offsets(from_offsets))
    elif from_timestamp:
        report = job.from_timestamp(TimestampStart.model_validate({"timestamp": from_timestamp}).timestamp)
    else:
        raise TerminalError("backfill needs one of batches, from_offsets or from_timestamp")
    return {"batches": len(report.batches), "rows": report.rows, "quarantined": report.quarantined}


def maintain(spark: SparkSession, config: str, pipeline: str) -> dict[str, Any]:
    from pipelines.maintain import maintain as compact_and_vacuum

    return compact_and_vacuum(spark, pipeline_context(config, pipeline).pipeline).to_dict()


def audit(spark: SparkSession, config: str, pipeline: str, docs: str | None) -> dict[str, Any]:
    from quality.audit import audit as run_checks
    from quality.audit import registry_of

    ctx = pipeline_context(config, pipeline)
    report = run_checks(spark, ctx.pipeline, kafka_options=ctx.spark_options, client_config=ctx.client_config,
                        docs_dir=Path(docs) if docs else settings().home_dir / "quality",
                        registry=registry_of(ctx.config, ctx.pipeline))
    return {"passed": report.passed, "docs": str(report.docs),
            "verdicts": [{"suite": v.suite, "check": v.check, "verdict": "PASS" if v.passed else "FAIL",
                          "observed": v.observed} for v in report.verdicts]}


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "ingest": ingest, "backfill": backfill, "maintain": maintain, "audit": audit}
"""By name, as a request to the warm driver names them."""


def slot_of(kind: str, pipeline: str) -> str:
    """What runs of ``kind`` must not overlap with: the ingest the pipeline's slot (orchestration.slots),
    the others their own kind only (a backfill, a compaction and an audit each run beside the ingest)."""
    return pipeline if kind == "ingest" else f"{pipeline}-{kind}"
