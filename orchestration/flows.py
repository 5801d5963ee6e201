"""Prefect 3 flows: ingest, backfill and audit of a pipeline, and relay supervision.

Each pipeline flow holds the pipeline's slot (:mod:`orchestration.slots`) for its whole
run, so two runs of one pipeline never overlap whatever started them: a schedule, a
manual run, a second ``serve``. The ledger claim would refuse a rival batch anyway; the
slot keeps the rival from even starting, and makes it wait instead of failing.

The work is a task whose retries follow :func:`orchestration.policy.retry_only_transient`,
with the delay doubling per attempt. Every run publishes a report artifact (rows,
offsets advanced, lag, quality verdict) under a stable key per pipeline, so the Prefect
UI shows each pipeline's history as one artifact timeline.

The Spark work itself is :mod:`orchestration.jobs`. Under ``tidemark serve`` it runs in
serve's warm driver (:mod:`orchestration.driver`), so a served run starts no JVM;
elsewhere Spark starts once per process, and a caller that runs flows in a loop
(``make demo``) reuses the session.
"""

from __future__ import annotations

import atexit
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from orchestration.context import PipelineContext, pipeline_context
from orchestration.policy import Backoff, ExitKind, classify_exit, describe_exit, retry_only_transient
from orchestration.slots import pipeline_slot
from tidemark.errors import TerminalError
from tidemark.settings import settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_spark: SparkSession | None = None
_spark_lock = threading.Lock()


def spark_session() -> SparkSession:
    """The process's SparkSession, started on first use and stopped at exit."""
    global _spark
    with _spark_lock:
        if _spark is None:
            from infra.spark import build_session

            _spark = build_session(settings(), "tidemark-orchestration")
            atexit.register(_spark.stop)
        return _spark


def stop_spark() -> None:
    """Stop the process's SparkSession now (a no-op if none was started)."""
    global _spark
    with _spark_lock:
        if _spark is not None:
            _spark.stop()
            _spark = None


class QualityCheckFailed(TerminalError):
    """An audit found a failing check; the Data Docs name the rows."""


def _artifact_key(kind: str, pipeline: str) -> str:
    return f"{kind}-{pipeline}".lower().replace("_", "-")


def _with_retries(fn: Any, ctx: PipelineContext) -> Any:
    sched = ctx.pipeline.schedule
    delays = [sched.retry_delay_seconds * 2 ** i for i in range(sched.retries)]
    return fn.with_options(retries=sched.retries, retry_delay_seconds=delays or 0,
                           retry_condition_fn=retry_only_transient)


# -- ingest -------------------------------------------------------------------------


def _job(kind: str, **kwargs: Any) -> dict[str, Any]:
    """Job ``kind`` in serve's warm driver when this run has one, else on this process's session."""
    from orchestration import driver, jobs

    result = driver.run(kind, **kwargs)
    return result if result is not None else jobs.JOBS[kind](spark_session(), **kwargs)


@task(name="ingest-batches")
def _ingest(config: str, pipeline: str) -> dict[str, Any]:
    return _job("ingest", config=config, pipeline=pipeline)


def _seconds_before_fetching(fetching_at: float | None) -> float | None:
    """From this flow run's start (Prefect's record) to its first batch's planning (jobs.ingest)."""
    from prefect import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if fetching_at is None or run_id is None:
        return None
    with get_client(sync_client=True) as client:
        started = client.read_flow_run(UUID(run_id)).start_time
    return None if started is None else round(fetching_at - started.timestamp(), 3)


@flow(name="tidemark-ingest", flow_run_name="ingest-{pipeline}")
def ingest_flow(pipeline: str, config: str = "tidemark.yaml") -> dict[str, Any]:
    """Ingest ``pipeline`` from its stored offsets up to the LSO, exactly once."""
    ctx = pipeline_context(config, pipeline, check=False)  # checked in the task, under its retries
    with pipeline_slot(pipeline, wait_seconds=ctx.pipeline.schedule.wait_for_slot_seconds) as slot:
        get_run_logger().info("holding the slot of pipeline %s (waited %.1fs)", pipeline, slot.waited_seconds)
        result = _with_retries(_ingest, ctx)(config, pipeline)
    result.update(slot=slot.as_dict(), seconds_before_fetching=_seconds_before_fetching(result["fetching_at"]))
    quality = _last_verdict(pipeline)
    create_table_artifact(
        key=_artifact_key("ingest", pipeline),
        table=[{"batches": result["batches"], "rows": result["rows"], "quarantined": result["quarantined"],
                "offsets advanced": result["offsets_advanced"], "txns held": result["held_transactions"],
                "lag (offsets)": result["lag"], "s before first fetch": result["seconds_before_fetching"],
                "last quality verdict": quality}],
        description=f"ingest of {pipeline} into {ctx.pipeline.target}")
    get_run_logger().info("%s: %d batch(es), %d rows, %s offsets advanced, lag %s; fetching %ss after the run "
                          "started", pipeline, result["batches"], result["rows"], result["offsets_advanced"],
                          result["lag"], result["seconds_before_fetching"])
    return result


def _last_verdict(pipeline: str) -> str:
    from quality.audit import last_verdict

    last = last_verdict(settings().home_dir / "quality", pipeline)
    if last is None:
        return "never audited"
    return f"{'PASS' if last['passed'] else 'FAIL'} at {last['at']}"


# -- backfill -----------------------------------------------------------------------


@task(name="backfill")
def _backfill(config: str, pipeline: str, into: str, batches: str | None, from_offsets: str | None,
              from_timestamp: str | None) -> dict[str, Any]:
    return _job("backfill", config=config, pipeline=pipeline, into=into, batches=batches,
                from_offsets=from_offsets, from_timestamp=from_timestamp)


@flow(name="tidemark-backfill", flow_run_name="backfill-{pipeline}")
def backfill_flow(pipeline: str, into: str, config: str = "tidemark.yaml", batches: str | None = None,
                  from_offsets: str | None = None, from_timestamp: str | None = None) -> dict[str, Any]:
    """Re-read stored batches (``"3-7"``), or from offsets or a time, into the table ``into``."""
    ctx = pipeline_context(config, pipeline, check=False)  # checked in the task, under its retries
    # Its own slot: a backfill writes another table and may run beside the pipeline's ingest.
    with pipeline_slot(f"{pipeline}-backfill", wait_seconds=ctx.pipeline.schedule.wait_for_slot_seconds):
        result = _with_retries(_backfill, ctx)(config, pipeline, into, batches, from_offsets, from_timestamp)
    create_table_artifact(key=_artifact_key("backfill", pipeline), table=[{"into": into, **result}],
                          description=f"backfill of {pipeline}")
    return dict(result)


# -- maintenance --------------------------------------------------------------------


@task(name="compact-and-vacuum")
def _maintain(config: str, pipeline: str) -> dict[str, Any]:
    return _job("maintain", config=config, pipeline=pipeline)


@flow(name="tidemark-maintain", flow_run_name="maintain-{pipeline}")
def maintain_flow(pipeline: str, config: str = "tidemark.yaml") -> dict[str, Any]:
    """Compact and vacuum ``pipeline``'s tables (pipelines.maintain), beside its ingest."""
    ctx = pipeline_context(config, pipeline, check=False)  # checked in the task, under its retries
    # Its own slot: compaction never conflicts with ingest's appends, only with another compaction.
    with pipeline_slot(f"{pipeline}-maintain", wait_seconds=ctx.pipeline.schedule.wait_for_slot_seconds):
        result = _with_retries(_maintain, ctx)(config, pipeline)
    create_table_artifact(
        key=_artifact_key("maintain", pipeline),
        table=[{"table": t["role"], "files before": t["files_before"], "files after": t["files_after"],
                "vacuumed": t["vacuumed"], "version": t["version"], "seconds": t["seconds"]}
               for t in result["tables"] if t["skipped"] is None],
        description=f"maintenance of {pipeline} (retention {result['retain_hours']:g} h)")
    return dict(result)


# -- audit --------------------------------------------------------------------------


@task(name="quality-checks")
def _audit(config: str, pipeline: str, docs: str | None) -> dict[str, Any]:
    return _job("audit", config=config, pipeline=pipeline, docs=docs)


@flow(name="tidemark-audit", flow_run_name="audit-{pipeline}")
def audit_flow(pipeline: str, config: str = "tidemark.yaml", docs: str | None = None) -> dict[str, Any]:
    """The quality checks; the run fails (never retried) if any check fails."""
    ctx = pipeline_context(config, pipeline, check=False)  # checked in the task, under its retries
    result = _with_retries(_audit, ctx)(config, pipeline, docs)
    create_table_artifact(key=_artifact_key("audit", pipeline), table=result["verdicts"],
                          description=f"quality checks of {pipeline}; Data Docs: file://{result['docs']}")
    if not result["passed"]:
        failed = [f"{v['suite']}: {v['check']}" for v in result["verdicts"] if v["verdict"] == "FAIL"]
        raise QualityCheckFailed(f"{pipeline}: {len(failed)} check(s) failed: {'; '.join(failed)}; "
                                 f"see file://{result['docs']}")
    return dict(result)


# -- relay supervision ----------------------------------------------------------------


@flow(name="tidemark-relay", flow_run_name="relay-supervisor")
def relay_flow(config: str = "tidemark.yaml", relay_id: str | None = None, max_restarts: int = 1000) -> dict[str, Any]:
    """Run ``tidemark relay run`` as a child, restarting it with backoff when it crashes.

    A clean exit (SIGTERM) ends the flow; a terminal exit (fenced, fatal, bad config)
    fails it without a restart, since a restart could not help and a fenced relay must
    stay down. Cancelling the flow run stops the relay with SIGTERM, which finishes the
    transaction in flight.
    """
    log = get_run_logger()
    argv = [sys.executable, "-m", "tidemark.cli", "relay", "run", "--config", config]
    if relay_id:
        argv += ["--relay-id", relay_id]
    backoff = Backoff()
    restarts = 0
    log_path = settings().home_dir / "logs" / "relay-supervised.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        started = time.monotonic()
        with log_path.open("ab") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=out)
            try:
                code = child.wait()
            except BaseException:  # the flow run is cancelled or the server stops: stop the relay cleanly
                child.terminate()
                child.wait(120)
                raise
        ran = time.monotonic() - started
        kind = classify_exit(code)
        create_markdown_artifact(key="relay-supervisor", markdown=(
            f"relay {describe_exit(code)} after {ran:.0f}s: **{kind.value}**; restarts so far {restarts}; "
            f"log `{log_path}`"))
        if kind is ExitKind.STOPPED:
            log.info("relay stopped cleanly after %.0fs", ran)
            return {"restarts": restarts, "exit": code}
        if kind is ExitKind.TERMINAL:
            raise TerminalError(f"relay stopped with {describe_exit(code)} (terminal: not restarted); "
                                f"read {log_path}, fix the cause, then start it again")
        if restarts >= max_restarts:
            raise TerminalError(f"relay crashed {restarts + 1} times; last {describe_exit(code)}; see {log_path}")
        delay = backoff.next_delay(ran)
        log.warning("relay %s after %.0fs; restarting in %.0fs", describe_exit(code), ran, delay)
        time.sleep(delay)
        restarts += 1
