"""``tidemark maintain``: keep a pipeline's three tables fast to commit to for months.

A pipeline that commits every few seconds adds a small file and a version to its target,
its ledger and (with bad records) its quarantine per batch. This keeps the files few and
the deleted ones within the time-travel promise. The other thing that grows, the commit
files in ``_delta_log``, must stay for time travel; what keeps it from slowing each batch
is the session's log store, which lists the log without walking all of it (infra/java,
docs/design.md "Months of history"). Per table, in this order:

1. **Compact.** ``OPTIMIZE``: small files bin-packed into large ones (the target
   clustered by ``maintenance.zorder_by`` if set; the ledger by ``batch_id``, so a
   restart's read of the newest intent stays a data-skipping lookup). Its commit adds and
   removes files with ``dataChange=false``: every version holds the same rows before and
   after, so a batch's source transactions stay whole (G3) and an ingest appending at the
   same time never conflicts with it — Delta checks a compaction only against removes and
   deletes, which ingest never makes. Compaction may lose a race against another
   compaction (two ``maintain`` runs): it then fails with a transient error, and nothing
   changed.
2. **Vacuum.** ``VACUUM`` with the table's retention, ``delta.deletedFileRetentionDuration``
   (Delta 4 ignores VACUUM's own argument), refused before step 1 if it or the log's
   retention is shorter than the pipeline's time-travel promise. It deletes files no
   version inside that window reads:
   those compaction replaced, and orphans of writes that never committed (a guarded write
   that tripped, a killed batch). Files a running batch is writing are new, so a retention
   longer than any batch keeps them. The count reported is Delta's own, from the
   ``VACUUM END`` commit, which Delta writes only on some stores (not ``s3a``) unless told
   to: the VACUUM runs with ``spark.databricks.delta.vacuum.logging.enabled`` on, so every
   store reports what it deleted.
3. **The log** gets no command: the compaction commit and ingest's own commits write
   checkpoints every ``delta.checkpointInterval`` versions, and checkpoints delete log
   files older than ``delta.logRetentionDuration`` (rounded down to the day). New tables are created with those
   properties (:meth:`tidemark.config.MaintenanceConfig.table_properties`); ``--apply-properties``
   sets them on existing ones. That is a metadata change: an ingest batch committing at
   the same instant fails with a conflict and is retried, so apply them once, best with
   ingest stopped.
4. **Record** the run in ``_tidemark_maintenance/<pipeline>.json`` beside the ledger (what
   ``tidemark status`` shows: when it ran, its retention, and from which version on each
   table can still be time-travelled).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from offsets.tables import delta_table_exists, maintenance_marker, read_text, table_shape, write_small_file
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError, TransientError
from tidemark.storage import require_exclusive_commits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Below this retention VACUUM may delete the files of a batch still being written.
SAFE_RETAIN_HOURS = 1.0

#: Delta writes the VACUUM START/END commits (where the count of deleted files is) only on
#: some stores unless this is on; ``s3a`` is not among them.
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"


@dataclass
class TableMaintenance:
    role: str
    """``target``, ``quarantine`` or ``ledger``."""
    path: str
    files_before: int = 0
    files_after: int = 0
    compacted_away: int = 0
    """Files compaction replaced (each now a ``remove`` with ``dataChange=false``)."""
    vacuumed: int = 0
    """Files VACUUM deleted."""
    retain_hours: float | None = None
    """The table's VACUUM retention (``delta.deletedFileRetentionDuration``), which VACUUM used."""
    version: int = -1
    """The table's version after the run."""
    seconds: float = 0.0
    skipped: str | None = None
    """Why nothing was done (no table yet)."""


@dataclass
class MaintenanceReport:
    pipeline: str
    started_at: str
    retain_hours: float
    tables: list[TableMaintenance] = field(default_factory=list)
    finished_at: str | None = None
    properties_applied: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def summary(self) -> str:
        done = [t for t in self.tables if t.skipped is None]
        return ", ".join(f"{t.role}: {t.files_before} → {t.files_after} files, {t.vacuumed} vacuumed"
                         for t in done) or "no tables yet"


def tables_of(pipeline: PipelineConfig) -> list[tuple[str, str]]:
    return [("target", pipeline.target), ("quarantine", pipeline.quarantine_path), ("ledger", pipeline.ledger_path)]


def maintain(spark: SparkSession, pipeline: PipelineConfig, *, apply_properties: bool = False) -> MaintenanceReport:
    """Steps 1-4 of the module doc for each of ``pipeline``'s tables that exists."""
    hours = pipeline.maintenance.retain_hours
    if hours < SAFE_RETAIN_HOURS:
        log.warning("VACUUM retention %.2g hours: files of a batch being written right now could be deleted; "
                    "use this only while nothing writes to %s's tables", hours, pipeline.name)
    report = MaintenanceReport(pipeline.name, _now(), hours, properties_applied=apply_properties)
    require_exclusive_commits(spark, [path for _, path in tables_of(pipeline)])
    existing = [(role, path) for role, path in tables_of(pipeline) if delta_table_exists(spark, path)]
    if apply_properties:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in pipeline.maintenance.table_properties().items())
        for _, path in existing:
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({props})")
    # Every table's retention is checked before any is touched: a refusal changes nothing.
    checked = {}
    for role, path in existing:
        files, properties = _detail(spark, path)
        checked[path] = TableMaintenance(role, path, files_before=files,
                                         retain_hours=check_retention(pipeline, path, properties))
    for role, path in tables_of(pipeline):
        if path in checked:
            report.tables.append(_maintain_table(spark, pipeline, checked[path]))
        else:
            report.tables.append(TableMaintenance(role, path, skipped="no table yet"))
    report.finished_at = _now()
    write_small_file(spark, maintenance_marker(pipeline.ledger_path, pipeline.name),
                     (json.dumps(report.to_dict(), sort_keys=True) + "\n").encode())
    log.info("maintained %s: %s", pipeline.name, report.summary())
    return report


#: Delta's defaults of the retention properties, in hours.
_DELTA_DEFAULT_HOURS = {"delta.deletedFileRetentionDuration": 7 * 24.0, "delta.logRetentionDuration": 30 * 24.0}
_INTERVAL_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(microsecond|millisecond|second|minute|hour|day|week)s?", re.IGNORECASE)
_HOURS_PER = {"microsecond": 1 / 3.6e9, "millisecond": 1 / 3.6e6, "second": 1 / 3600, "minute": 1 / 60, "hour": 1.0,
              "day": 24.0, "week": 168.0}


def interval_hours(text: str) -> float | None:
    """A Delta interval property (``interval 7 days``, ``interval 1 week 2 hours``) in hours; None if unreadable."""
    parts = _INTERVAL_PART.findall(text)
    return sum(float(n) * _HOURS_PER[unit.lower()] for n, unit in parts) if parts else None


def check_retention(pipeline: PipelineConfig, path: str, properties: Mapping[str, str]) -> float:
    """The table's VACUUM retention in hours, refused if it or its log retention is shorter than the promise.

    Delta 4 takes VACUUM's retention from ``delta.deletedFileRetentionDuration`` (its
    argument is ignored), and time travel needs the log too (``delta.logRetentionDuration``).
    """
    promise = pipeline.maintenance.time_travel_hours
    found: dict[str, float | None] = {}
    for key, default in _DELTA_DEFAULT_HOURS.items():
        found[key] = interval_hours(properties[key]) if key in properties else default
    short = {k: v for k, v in found.items() if v is None or v < promise}
    if short:
        said = ", ".join(f"{k} = {properties.get(k, 'the Delta default')!r}" for k in short)
        raise ConfigError(
            f"{path}: {said} is shorter than this pipeline's promise (maintenance.time_travel_hours: {promise:g}): "
            "VACUUM or log cleanup would delete versions time travel and backfills of stored batches still "
            f"read. Nothing was compacted or vacuumed. Run `tidemark maintain {pipeline.name} --apply-properties` "
            "to set the table's retention from the config, or lower maintenance.time_travel_hours")
    retention = found["delta.deletedFileRetentionDuration"]
    assert retention is not None
    if abs(retention - pipeline.maintenance.retain_hours) > 1e-9:
        log.warning("%s keeps deleted files %g hours, the config says %g (maintenance.vacuum_retain_hours): VACUUM "
                    "follows the table; `tidemark maintain %s --apply-properties` sets it from the config",
                    path, retention, pipeline.maintenance.retain_hours, pipeline.name)
    return retention


def last_run(pipeline: PipelineConfig) -> dict[str, object] | None:
    """The last recorded maintenance run of ``pipeline`` (step 4), read with no JVM; None if never."""
    text = read_text(maintenance_marker(pipeline.ledger_path, pipeline.name))
    return json.loads(text) if text else None


def vacuumed(run: Mapping[str, Any] | None, role: str) -> tuple[datetime, float] | None:
    """When the last run vacuumed table ``role``, and with what retention (hours); None if it did not."""
    for table in (run or {}).get("tables") or ():
        if table.get("role") == role and table.get("skipped") is None and table.get("retain_hours") is not None:
            return datetime.fromisoformat(str(run["finished_at"])), float(table["retain_hours"])  # type: ignore[index]
    return None


def readable_from(pipeline: PipelineConfig, role: str, path: str) -> int | None:
    """The oldest version of ``pipeline``'s table ``role`` still readable after the last VACUUM (None: no table)."""
    shape = table_shape(path, vacuumed(last_run(pipeline), role))
    return None if shape is None else shape.oldest_readable_version


def _detail(spark: SparkSession, path: str) -> tuple[int, dict[str, str]]:
    """The table's file count and properties (``DESCRIBE DETAIL``)."""
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("numFiles", "properties").first()
    assert detail is not None
    return int(detail["numFiles"]), dict(detail["properties"] or {})


def _maintain_table(spark: SparkSession, pipeline: PipelineConfig, done: TableMaintenance) -> TableMaintenance:
    """Steps 1 and 2 of one table whose retention ``done`` holds, checked; ``done`` filled in."""
    from delta.tables import DeltaTable

    started = time.monotonic()
    role, path = done.role, done.path
    table = DeltaTable.forPath(spark, path)

    # Step 1. Compact.
    optimize = table.optimize()
    clustering = {"target": pipeline.maintenance.zorder_by, "ledger": ("batch_id",)}.get(role, ())
    try:
        metrics = (optimize.executeZOrderBy(*clustering) if clustering else optimize.executeCompaction()).collect()
    except _conflicts() as error:
        raise TransientError(f"compaction of {path} lost a race against another compaction (two `tidemark "
                             f"maintain {pipeline.name}` at once?); nothing changed, run it again") from error
    done.compacted_away = int(metrics[0]["metrics"]["numFilesRemoved"]) if metrics else 0

    # Step 2. Vacuum, with the table's retention (checked above against the promise).
    before = _newest_version(table)
    _vacuum_logged(spark, table)
    done.version = _newest_version(table)
    # Every commit since `before` (ingest's may have followed the VACUUM's): the oldest END is this one's.
    since = table.history(max(done.version - before, 1)).select("version", "operation", "operationMetrics").collect()
    ends = sorted((r for r in since if r.operation == "VACUUM END"), key=lambda r: r.version)
    if not ends:
        raise TransientError(f"VACUUM of {path} ran, but its VACUUM END commit is not in the table's log, "
                             f"so how many files it deleted is unknown; run `tidemark maintain {pipeline.name}` "
                             "again")
    done.vacuumed = int((ends[0].operationMetrics or {}).get("numDeletedFiles", 0))
    done.files_after = _detail(spark, path)[0]
    done.seconds = round(time.monotonic() - started, 3)
    return done


def _newest_version(table: Any) -> int:
    return int(table.history(1).select("version").first()[0])


def _vacuum_logged(spark: SparkSession, table: Any) -> None:
    """``VACUUM`` with its START and END commits written on every store (:data:`VACUUM_LOGGING`),
    the session's own setting restored after."""
    previous = spark.conf.get(VACUUM_LOGGING, None)
    spark.conf.set(VACUUM_LOGGING, "true")
    try:
        table.vacuum()
    finally:
        if previous is None:
            spark.conf.unset(VACUUM_LOGGING)
        else:
            spark.conf.set(VACUUM_LOGGING, previous)


def _conflicts() -> tuple[type[BaseException], ...]:
    from delta import exceptions as dx

    return (dx.ConcurrentDeleteReadException, dx.ConcurrentDeleteDeleteException,
            dx.DeltaConcurrentModificationException)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
