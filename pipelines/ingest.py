"""``tidemark ingest``: bounded batches up to an LSO snapshot, or ``--follow`` micro-batches.

The job only wires things together: Kafka metadata (connectors), the frame builder
(pipelines.transform) and the commit protocol (offsets.protocol), which owns every
step that matters for exactly-once.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from connectors.admin import TP, KafkaAdmin, PartitionBounds
from connectors.kafka_config import librdkafka_config, spark_options
from connectors.preflight import spark_refusal
from connectors.registry import Registry
from connectors.sizes import bytes_per_offset
from offsets.frames import BatchFrames, BatchResult
from offsets.ledger import Intent, Schemas
from offsets.protocol import CommitProtocol
from pipelines import subjects
from pipelines.dedup import table_version
from pipelines.evolution import SchemaChange, compare
from pipelines.transactions.consumers import ManifestConsumers
from pipelines.transactions.plan import Planner
from pipelines.transactions.starts import whole_starts
from pipelines.transform import columns_ahead, frames, good_schema
from tidemark.config import PipelineConfig, TidemarkConfig
from tidemark.errors import (
    ConfigError,
    RegistryUnavailableError,
    ServiceUnavailableError,
    TidemarkError,
    TransientError,
)
from tidemark.settings import load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Delta's refusals of an append whose schema does not match the table's (another writer changed it
#: after :meth:`IngestJob.evolve_schema` looked).
_SCHEMA_MOVED = re.compile(r"DELTA_METADATA_MISMATCH|DELTA_FAILED_TO_MERGE_FIELDS")

#: The longest a follower waits between probes of a Kafka that does not answer (1, 2, 4 ... s before).
OUTAGE_MAX_WAIT_SECONDS = 30.0

#: How long a one-shot run (``tidemark ingest``, a scheduled run) waits out an outage in all
#: before it stops with exit 75, saying so.
ONE_SHOT_PATIENCE_SECONDS = 60.0

#: What in a failed Spark job's text says a request to the object store failed (S3A's client
#: errors, timeouts of its connections), rather than Tidemark or Kafka.
_STORE_FAILURES = ("AWSClientIOException", "SdkClientException", "AWSStatus500Exception", "ApiCallTimeoutException",
                   "ApiCallAttemptTimeoutException", "SocketTimeoutException", "ConnectTimeoutException",
                   "AWSServiceThrottledException", "Unable to execute HTTP request")

#: How long a follower may move no offset while its partitions hold data past its ends before
#: it warns (and again each time as long): an INFO line a batch is not enough for a stop.
STALL_WARN_SECONDS = 30.0


class _Outages:
    """A run's waits for a server that does not answer: the lines an operator reads, the metrics
    hook, and the backoff (1, 2, 4 ... up to :data:`OUTAGE_MAX_WAIT_SECONDS` s)."""

    def __init__(self, job: IngestJob) -> None:
        self.job = job
        self.waits = 0
        self.waited = 0.0
        self.what = "Kafka"
        self.cause = ""
        self.kafka_down = False

    def failed(self, exc: Exception) -> float:
        """The pause before the next try after ``exc``; re-raises what is no outage."""
        found = self.job.outage_cause(exc)
        if found is None:
            raise exc
        self.what, self.cause = found
        self.waits += 1
        if (self.what == "Kafka") != self.kafka_down:  # the Kafka gauge follows what is down now
            self.kafka_down = not self.kafka_down
            self.job._outage(self.kafka_down)
        pause = min(OUTAGE_MAX_WAIT_SECONDS, 2.0 ** min(self.waits, 5))
        log.warning("%s; waiting %.0f s for %s, then the batch in flight is recovered and tried again "
                    "(outage wait %d)", self.cause, pause, self.what, self.waits)
        self.job.protocol.forget()
        return pause

    def answered(self) -> None:
        if not self.waits:
            return
        log.warning("%s answers again after %d outage wait(s); going on", self.what, self.waits)
        if self.kafka_down:
            self.job._outage(False)
        self.waits, self.waited, self.kafka_down = 0, 0.0, False


@dataclass
class _Stall:
    """Since when a follower's offsets have not moved while data waited, and when it last warned."""

    since: float | None = None
    warned: float = 0.0

    def seen(self, now: float, *, moved: bool) -> float:
        """Seconds stalled after one step (0: it moved, or nothing waits)."""
        if moved:
            self.since = None
            self.warned = 0.0
            return 0.0
        self.since = now if self.since is None else self.since
        return now - self.since

    def due(self, now: float) -> bool:
        """Whether to warn now: first at the threshold, then every :data:`STALL_WARN_SECONDS`."""
        if now - self.warned < STALL_WARN_SECONDS:
            return False
        self.warned = now
        return True


def _partitions(behind: Mapping[TP, tuple[int, int]]) -> str:
    shown = ", ".join(f"{t}[{p}] (at {end}, LSO {lso})" for (t, p), (end, lso) in sorted(behind.items())[:6])
    return f"partition(s) {shown}" + (f" and {len(behind) - 6} more" if len(behind) > 6 else "")


@dataclass
class IngestReport:
    batches: list[BatchResult] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def quarantined(self) -> int:
        return sum(b.quarantined for b in self.batches)

    def summary(self) -> str:
        return f"{len(self.batches)} batch(es), {self.rows} rows, {self.quarantined} quarantined"


class IngestJob:
    def __init__(self, spark: SparkSession, config: TidemarkConfig, pipeline: PipelineConfig, bootstrap: str,
                 *, start_offsets: Mapping[TP, int] | None = None, dedup_table: str | None = None) -> None:
        self.spark = spark
        self.pipeline = pipeline
        self.dedup_table = dedup_table or pipeline.target
        """Where dedup looks event ids up: the target, or for a backfill of stored batches the original table."""
        self.start_offsets = dict(start_offsets or {})
        """Explicit start offsets of new partitions (a backfill), instead of the start policy."""
        self.on_outage: Callable[[bool], None] | None = None
        """Called when a follower starts waiting for Kafka (True) and when Kafka answers again (False)."""
        self.on_stall: Callable[[float], None] | None = None
        """Called after each follower step with the seconds its offsets have not moved while data waited
        past them (0 once they move): the stall gauge."""
        self.planned: Intent | None = None
        """The newest decided plan (its waits and held count name what a stalled follower waits on)."""
        self.on_batch: Callable[[BatchResult, float], None] | None = None
        """Called after each committed batch with its seconds (metrics); a replay found at start counts
        its own call's seconds only when no new batch followed it in the same call."""
        kafka = config.with_security(pipeline.kafka_security).kafka  # the pipeline's own principal, if any
        self.client_config = librdkafka_config(kafka, bootstrap)
        self.kafka_options = spark_options(kafka, bootstrap)
        self.g3 = Planner(self.client_config, pipeline) if pipeline.transactions.atomic else None
        """The pipeline's G3 plan of each batch (its manifest reads share the run's consumers: :meth:`_run_scope`)."""
        self._admin: KafkaAdmin | None = None
        """The admin client this run's snapshots share (:meth:`_run_scope`)."""
        self.registry = Registry(config.schema_registry, load_settings()) if pipeline.uses_registry else None
        """Where an Avro or Protobuf pipeline's schemas are read (:mod:`pipelines.subjects`)."""
        self._checked_schemas: Schemas | None = None
        """The newest batch schemas checked against the target (:meth:`_check_schemas`)."""
        self.keep_warm = False
        """The session outlives each batch (``--follow``, ``serve``): see :class:`offsets.frames.BatchSource`."""
        self._write_options: dict[str, str] = {}
        """``mergeSchema`` once the pipeline's schema evolution found its batches add or widen columns."""
        if self.registry is not None:
            # A batch's new schema was checked when it was planned (before its claim), its
            # replay's too: every append may evolve the table (pipelines.evolution).
            self._write_options = {"mergeSchema": "true"}
        self.on_step: Callable[[str], None] | None = None
        """Told each step of the commit protocol as it is reached, after this job's own timing."""
        self.protocol = CommitProtocol(
            spark, self, pipeline=pipeline.name, target=pipeline.target, quarantine=pipeline.quarantine_path,
            ledger=pipeline.ledger_path, partition_by=pipeline.partition_by,
            table_properties=pipeline.maintenance.table_properties(),
            checkpoint_every=pipeline.maintenance.checkpoint_interval,
        )
        self._marks: list[tuple[str, float]] = []
        self.fetching_at: float | None = None
        """Wall-clock time the first batch of this job started planning: no record is fetched before it."""
        self.schema_change: SchemaChange | None = None
        """What this job's batches do to the target's schema (None: not checked yet; :meth:`evolve_schema`)."""

    # -- the pipeline's side of each batch (offsets.frames.BatchSource) -------------------

    @property
    def max_records(self) -> int:
        return self.pipeline.max_records_per_batch

    @property
    def max_bytes(self) -> int | None:
        return self.pipeline.max_bytes_per_batch

    def decide(self, intent: Intent, last: Intent | None, bounds: Mapping[TP, PartitionBounds]) -> Intent:
        """Step 2's decisions (see offsets.protocol): G3's plan, the batch's schemas, then dedup's table version."""
        if self.g3 is not None:
            intent = self.g3.decide(intent, last, bounds)
        self.planned = intent
        if self.registry is not None:
            topics = (r.topic for r in intent.ranges)
            intent = replace(intent, schemas=subjects.plan(self.registry, self.pipeline, topics))
            self._check_schemas(intent.schemas)
        if self.pipeline.dedup is not None:
            intent = replace(intent, dedup_version=table_version(self.spark, self.dedup_table))
        return intent

    def revise(self, proposal: Intent, last: Intent | None, bounds: Mapping[TP, PartitionBounds] | None) -> Intent:
        """A guarded batch whose write met a multi-event transaction, proposed again: the scan and
        cut, the guarded intent's other decisions kept."""
        planner = self.g3 or Planner(self.client_config, self.pipeline)  # a batch stored guarded
        self.planned = planner.revise(proposal, last, self.snapshot() if bounds is None else bounds)
        return self.planned

    def frames(self, intent: Intent) -> BatchFrames:
        if intent.schemas is None and self.registry is not None and intent.is_empty:
            # A first batch that reads nothing still creates the target (its readers find a table):
            # with the subject's schemas now, as it holds no record to decode.
            intent = replace(intent, schemas=subjects.plan(self.registry, self.pipeline,
                                                           (r.topic for r in intent.ranges)))
        listed = self.g3.listed_for(intent) if self.g3 is not None else ()
        return frames(self.spark, self.kafka_options, self.pipeline, intent, dedup_table=self.dedup_table,
                      listed=listed, registry=self.registry)

    def write_options(self) -> Mapping[str, str]:
        return self._write_options

    def reached(self, step: str) -> None:
        if step == "recovered" and self.fetching_at is None:
            self.fetching_at = time.time()
        self._marks.append((step, time.monotonic()))
        if self.on_step is not None:
            self.on_step(step)

    def snapshot(self) -> dict[TP, PartitionBounds]:
        """Every source partition with its log-start offset and LSO, now (the LSOs of one instant)."""
        with nullcontext(self._admin) if self._admin is not None else KafkaAdmin(self.client_config) as admin:
            return admin.bounds(admin.partitions_matching(self.pipeline.topics, self.pipeline.topic_pattern))

    def new_starts(self, partitions: list[TP], bounds: Mapping[TP, PartitionBounds],
                              known: bool) -> Mapping[TP, int]:
        """Starts of ``partitions``, within ``bounds`` (the snapshot the batch is planned to).

        The start policy applies to a pipeline's first batch only. A partition or a matching
        topic that appears later is new to a running pipeline: all of it is the pipeline's
        to read, so it starts at its log start. (At ``latest`` it would skip its first events.)
        """
        if self.start_offsets:
            missing = sorted(tp for tp in partitions if tp not in self.start_offsets)
            if missing:
                raise ConfigError("no start offset given for partition(s) "
                                  + ", ".join(f"{t}:{p}" for t, p in missing) + "; add them as TOPIC:PARTITION=OFFSET")
            return {tp: self.start_offsets[tp] for tp in partitions}
        start = self.pipeline.start
        if known or start == "earliest":
            return {tp: bounds[tp].log_start for tp in partitions}
        if start == "latest":
            starts = {tp: bounds[tp].stable_end for tp in partitions}
        else:
            with KafkaAdmin(self.client_config) as admin:
                found = admin.offsets_for_time(partitions, start.timestamp)
            # Records that arrived after the snapshot belong to a later batch.
            starts = {tp: min(found[tp], bounds[tp].stable_end) for tp in partitions}
        if self.pipeline.transactions.atomic:  # no source transaction split by where reading starts
            starts = whole_starts(self.client_config, self.pipeline, starts, bounds)
        return starts

    def sizes(self, ranges: Mapping[TP, tuple[int, int]]) -> Mapping[TP, float]:
        return bytes_per_offset(self.client_config, ranges)

    def run_to(self, bounds: Mapping[TP, PartitionBounds], stop: threading.Event | None = None) -> IngestReport:
        """Batches until every partition reaches ``bounds`` (a fixed LSO snapshot)."""
        columns_ahead(self.spark, self.pipeline)
        with self._run_scope():
            return self._run_to(bounds, stop)

    @contextmanager
    def _run_scope(self) -> Iterator[None]:
        """What the batches of the outermost run (one :meth:`run_to`, or all of :meth:`follow`) share:
        the manifest's consumers (kept afterwards for the process's next run with the same
        settings: :meth:`~pipelines.transactions.consumers.ManifestConsumers.kept`), and the admin
        client its snapshots ask (a follower's snapshot is then one metadata and one offsets
        round trip, not a new client's connection)."""
        if self._admin is not None:
            yield
            return
        with ManifestConsumers.kept(self.client_config) as reads:
            if self.g3 is not None:
                self.g3.reads = reads
            self._admin = KafkaAdmin(self.client_config)
            try:
                yield
            finally:
                admin, self._admin = self._admin, None
                if self.g3 is not None:
                    self.g3.reads = None
                admin.close()

    def evolve_schema(self) -> None:
        """Check the batch's schema against the target's once, before this job's first batch (a
        replay's included): stop on a change the pipeline's ``schema_evolution`` refuses, before
        anything is claimed; else let step 4 write the change in the batch's own commit."""
        if self.schema_change is not None:
            return
        if self.pipeline.uses_registry:  # each batch's schemas are checked when it is planned
            self.schema_change = SchemaChange()
            return
        self.schema_change = self._evolve_to(lambda: good_schema(self.spark, self.kafka_options, self.pipeline),
                                             "the batch's schema")
        if self.schema_change.alters_table:
            self._write_options = {"mergeSchema": "true"}

    def _check_schemas(self, schemas: Schemas | None) -> None:
        """Avro and Protobuf: a batch's reader schema against the target's, before its claim (once per
        new set of schemas); stops on a change ``schema_evolution`` refuses."""
        if schemas is None or schemas == self._checked_schemas:
            return
        # Built even before the target exists: a schema that cannot be decoded stops here, unclaimed.
        batch = good_schema(self.spark, self.kafka_options, self.pipeline, schemas, self.registry)
        self._evolve_to(lambda: batch, f"schema id {schemas.reader} of subject {schemas.subject}")
        self._checked_schemas = schemas

    def _evolve_to(self, batch_schema: Callable[[], StructType], what: str) -> SchemaChange:
        """What writing batches of ``batch_schema()`` does to the target (:func:`pipelines.evolution.compare`,
        which raises on a change the pipeline refuses, a widening it has not opted into included);
        type widening turned on if it widens."""
        from offsets.tables import delta_table_exists

        pipeline = self.pipeline
        if not delta_table_exists(self.spark, pipeline.target):
            return SchemaChange()  # the first batch creates it with its own schema
        table = self.spark.read.format("delta").load(pipeline.target).schema
        change = compare(table, batch_schema(), pipeline.schema_evolution, pipeline=pipeline.name,
                         target=pipeline.target, partition_by=pipeline.partition_by,
                         type_widening=pipeline.type_widening)
        if change.widened:
            self._allow_widening()
        if change.alters_table or change.kept:
            log.warning("pipeline %s: %s %s; the next batch's commit changes the target's schema with its rows",
                        pipeline.name, what, change.describe())
        return change

    def _allow_widening(self) -> None:
        """Turn on Delta's type widening on the target, unless it is on (a commit of its own, which
        changes no schema and no data: a crash after it leaves only the feature on). Only for a
        pipeline with ``type_widening: allow``: readers without the feature lose the table."""
        from delta.tables import DeltaTable

        from pipelines.evolution import WIDENING_READERS

        target = self.pipeline.target
        detail = DeltaTable.forPath(self.spark, target).detail().select("properties").first()
        if detail is not None and str(detail[0].get("delta.enableTypeWidening", "")).lower() == "true":
            return
        log.warning("pipeline %s: turning on Delta's type widening on %s (delta.enableTypeWidening, "
                    "type_widening: allow); its %s", self.pipeline.name, target, WIDENING_READERS)
        quoted = target.replace("`", "``")
        self.spark.sql(f"ALTER TABLE delta.`{quoted}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")

    def _run_to(self, bounds: Mapping[TP, PartitionBounds], stop: threading.Event | None) -> IngestReport:
        self.evolve_schema()
        report = IngestReport()
        while not (stop and stop.is_set()):
            started = time.monotonic()
            self._marks = [("start", started)]
            try:
                replay, result = self.protocol.run_batch(bounds)
            except Exception as exc:
                if not isinstance(exc, TidemarkError) and _SCHEMA_MOVED.search(str(exc)):
                    self.schema_change = None  # checked again by the next run
                    raise TransientError(
                        f"pipeline {self.pipeline.name!r}: the target's schema changed while this run wrote to "
                        f"{self.pipeline.target} (another writer), so its batch was not committed. Run again: the next "
                        "run checks the new schema first, then writes the batch") from exc
                refusal = None if isinstance(exc, TidemarkError) else spark_refusal(exc, self.client_config)
                if refusal is None:
                    raise
                raise refusal from None
            elapsed = time.monotonic() - started
            if self.on_batch is not None:
                for done in (replay, result):
                    if done is not None:
                        self.on_batch(done, elapsed if done is result or result is None else 0.0)
            if replay is not None:
                log.warning("replayed batch %d (%d rows)", replay.intent.batch_id, replay.rows)
                report.batches.append(replay)
            if result is None:
                held = self.planned.held if self.planned is not None else 0
                if held:
                    log.info("caught up, except %d source transaction(s) not yet whole (events below the LSO "
                             "missing: released after transactions.incomplete_timeout_seconds)", held)
                break
            log.info("batch %d committed: %d rows, %d quarantined (%s)",
                     result.intent.batch_id, result.rows, result.quarantined, self._timing())
            report.batches.append(result)
            if result.intent.is_empty:
                break  # it moved no offset (a wait's or a partition's start): the next one would not either
        return report

    def _timing(self) -> str:
        """Seconds per step of the batch just committed, each named by the step it ends (offsets.protocol)."""
        names = {"recovered": "recover", "planned": "plan", "claimed": "claim", "committed": "commit",
                 "revised": "revise", "quarantined": "settle", "checkpointed": "checkpoint"}
        return ", ".join(f"{names.get(step, step)} {at - before:.2f}s"
                         for (_, before), (step, at) in zip(self._marks, self._marks[1:], strict=False))

    def run_bounded(self, patience: float = ONE_SHOT_PATIENCE_SECONDS) -> IngestReport:
        """Batches up to the LSOs of one snapshot, then return. An outage (Kafka, the schema
        registry, the object store) is waited out for ``patience`` seconds in all, then stops the
        run with a :class:`ServiceUnavailableError` (exit 75) that says so; what was committed stays."""
        columns_ahead(self.spark, self.pipeline)  # built while the snapshot asks Kafka
        outages = _Outages(self)
        report = IngestReport()
        bounds: dict[TP, PartitionBounds] | None = None
        with self._run_scope():
            while True:
                try:
                    bounds = self.snapshot() if bounds is None else bounds
                    report.batches += self.run_to(bounds).batches
                    outages.answered()
                    return report
                except Exception as exc:
                    pause = outages.failed(exc)
                    if outages.waited + pause > patience:
                        raise ServiceUnavailableError(
                            f"pipeline {self.pipeline.name!r}: {outages.what} did not answer for {outages.waited:.0f} s "
                            f"({outages.cause}); this run stops after committing {len(report.batches)} batch(es). "
                            "Run it again once it answers: the batch in flight is recovered") from exc
                    time.sleep(pause)
                    outages.waited += pause

    def follow(self, stop: threading.Event) -> IngestReport:
        """Micro-batches until ``stop`` is set; the batch in flight always finishes first. An outage
        (Kafka, the schema registry, the object store) is waited out, however long."""
        self.keep_warm = True
        columns_ahead(self.spark, self.pipeline)
        report = IngestReport()
        outages = _Outages(self)
        stall = _Stall()
        with self._run_scope():
            try:
                while not stop.is_set():
                    try:
                        bounds = self.snapshot()
                        step = self.run_to(bounds, stop)
                    except Exception as exc:  # noqa: BLE001 - failed() re-raises all but an outage
                        stop.wait(outages.failed(exc))
                        continue
                    outages.answered()
                    report.batches += step.batches
                    self._watch_stall(stall, step, bounds)
                    if not step.batches:
                        stop.wait(self.pipeline.trigger_interval_seconds)
            finally:
                self.protocol.quiesce()
        return report

    def _watch_stall(self, stall: _Stall, step: IngestReport, bounds: Mapping[TP, PartitionBounds]) -> None:
        """Warn when no offset has moved for :data:`STALL_WARN_SECONDS` while data waits past the ends."""
        now = time.monotonic()
        moved = any(not b.intent.is_empty for b in step.batches)
        last = next((b.intent for b in reversed(step.batches)), None) or self.planned
        behind = {} if last is None else {tp: (end, bounds[tp].stable_end) for tp, end in last.ends().items()
                                          if tp in bounds and bounds[tp].stable_end > end}
        seconds = stall.seen(now, moved=moved or not behind)
        if self.on_stall is not None:
            try:
                self.on_stall(seconds)
            except Exception:  # metrics must not stop ingestion
                log.exception("metrics: recording a stall failed")
        if seconds >= STALL_WARN_SECONDS and stall.due(now):
            log.warning("pipeline %s: no offset has moved for %.0f s although %s hold data past its ends: %s",
                        self.pipeline.name, seconds, _partitions(behind), self._waiting_on())

    def _waiting_on(self) -> str:
        """What the newest plan holds back, for the stall warning."""
        plan = self.planned
        if plan is None:
            return "no plan decided yet"
        parts = []
        if plan.waiting:
            names = ", ".join(f"{txn} (since {w.since.isoformat(timespec='seconds')})"
                              for txn, w in sorted(plan.waiting.items())[:5])
            parts.append(f"{len(plan.waiting)} source transaction(s) missing events below the LSO, released or "
                         f"refused after transactions.incomplete_timeout_seconds: {names}")
        if plan.held > len(plan.waiting):
            parts.append(f"{plan.held - len(plan.waiting)} source transaction(s) whole in Kafka held for a "
                         "later batch")
        return "; ".join(parts) or "nothing held (docs/runbooks.md, 'A follower that does not move')"

    def _outage(self, down: bool) -> None:
        if self.on_outage is not None:
            try:
                self.on_outage(down)
            except Exception:  # metrics must not stop ingestion
                log.exception("metrics: recording an outage failed")

    def outage_cause(self, exc: Exception) -> tuple[str, str] | None:
        """What ``exc`` says is down, and why, if it is an outage to wait out rather than a reason to
        stop: (``Kafka`` | ``the schema registry`` | ``the object store``, one line). None for
        anything else (a rival run, a refusal, bad config, a bug), which stops the run."""
        from connectors.kafka_errors import retriable_cause
        from connectors.preflight import check_access
        from offsets.protocol import ConcurrentWriterError
        from tidemark.errors import TerminalError

        if isinstance(exc, RegistryUnavailableError):
            return "the schema registry", str(exc)
        if isinstance(exc, ConcurrentWriterError) or (isinstance(exc, TerminalError)
                                                      and not isinstance(exc, ServiceUnavailableError)):
            return None
        store = self._store_lost(exc)
        if store is not None:
            return "the object store", store
        cause = retriable_cause(exc)
        if cause is not None:
            servers = self.client_config.get("bootstrap.servers", "?")
            return "Kafka", f"Kafka at {servers} answered with a retriable error ({cause})"
        if isinstance(exc, ServiceUnavailableError):
            return "Kafka", str(exc)
        try:
            check_access(self.client_config)
        except ServiceUnavailableError as probe:
            return "Kafka", str(probe)
        except Exception:  # noqa: BLE001  (a refusal, not an outage: the original error stands)
            return None
        return None

    def _store_lost(self, exc: Exception) -> str | None:
        """Why a failure of a pipeline on object storage is the store's: it does not answer a probe
        now, or the failure is a request to it that failed or timed out. None otherwise."""
        from tidemark.errors import ServiceUnavailableError
        from tidemark.storage import check_reachable, on_s3

        paths = [p for p in (self.pipeline.target, self.pipeline.quarantine_path, self.pipeline.ledger_path)
                 if on_s3(p)]
        if not paths:
            return None
        try:
            check_reachable(paths)
        except ServiceUnavailableError as probe:
            return str(probe)
        text = str(exc)
        marker = next((m for m in _STORE_FAILURES if m in text), None)
        if marker is None:
            return None
        line = next((ln.strip() for ln in text.splitlines() if marker in ln), marker)
        return f"a request to the object store failed during the batch ({line[:300]})"
