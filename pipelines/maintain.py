"""``tidemark maintain``: keep a pipeline's three tables fast to commit to for months.

A pipeline that commits every few seconds adds a small file and a version to its target,
its ledger and (with bad records) its quarantine per batch. Each append with
``txnAppId`` rebuilds the table's snapshot state, whose cost follows the number of files
in it, so without maintenance every batch gets slower (docs/benchmarks.md, "Per-batch
cost vs history"). Per table, in this order:

1. **Compact.** ``OPTIMIZE``: small files bin-packed into large ones (the target
   clustered by ``maintenance.zorder_by`` if set; the ledger by ``batch_id``, so a
   restart's read of the newest intent stays a data-skipping lookup). Its commit adds and
   removes files with ``dataChange=false``: every version holds the same rows before and
   after, so a batch's source transactions stay whole (G3) and an ingest appending at the
   same time never conflicts with it — Delta checks a compaction only against removes and
   deletes, which ingest never makes. Compaction may lose a race against another
   compaction (two ``maintain`` runs): it then fails with a transient error, and nothing
   changed.
2. **Vacuum.** ``VACUUM`` with ``maintenance.retain_hours``, refused if shorter than the
   pipeline's time-travel promise. It deletes files no version inside that window reads:
   those compaction replaced, and orphans of writes that never committed (a guarded write
   that tripped, a killed batch). Files a running batch is writing are new, so a retention
   longer than any batch keeps them.
3. **The log** needs no command: the compaction commit and ingest's own commits write
   checkpoints every ``delta.checkpointInterval`` versions, and checkpoints delete log
   files older than ``delta.logRetentionDuration``. New tables are created with those
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
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from offsets.tables import delta_table_exists, maintenance_marker, read_text, table_shape, write_small_file
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError, TransientError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Below this retention VACUUM may delete the files of a batch still being written.
SAFE_RETAIN_HOURS = 1.0

#: How many of a table's newest commits are searched for the VACUUM's own (ingest commits meanwhile).
HISTORY_WINDOW = 50


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


def maintain(spark: SparkSession, pipeline: PipelineConfig, *, retain_hours: float | None = None,
             apply_properties: bool = False) -> MaintenanceReport:
    """Steps 1-4 of the module doc for each of ``pipeline``'s tables that exists."""
    settings = pipeline.maintenance
    hours = settings.retain_hours if retain_hours is None else retain_hours
    settings.check_retention(hours)
    if hours < SAFE_RETAIN_HOURS:
        log.warning("VACUUM retention %.2g hours: files of a batch being written right now could be deleted; "
                    "use this only while nothing writes to %s's tables", hours, pipeline.name)
    report = MaintenanceReport(pipeline.name, _now(), hours, properties_applied=apply_properties)
    for role, path in tables_of(pipeline):
        report.tables.append(_maintain_table(spark, pipeline, role, path, hours, apply_properties))
    report.finished_at = _now()
    write_small_file(spark, maintenance_marker(pipeline.ledger_path, pipeline.name),
                     (json.dumps(report.to_dict(), sort_keys=True) + "\n").encode())
    log.info("maintained %s: %s", pipeline.name, report.summary())
    return report


def last_run(pipeline: PipelineConfig) -> dict[str, object] | None:
    """The last recorded maintenance run of ``pipeline`` (step 4), read with no JVM; None if never."""
    text = read_text(maintenance_marker(pipeline.ledger_path, pipeline.name))
    return json.loads(text) if text else None


def readable_from(pipeline: PipelineConfig, path: str, run: Mapping[str, object] | None = None) -> int | None:
    """The oldest version of the table at ``path`` still readable after the last VACUUM (None: no table)."""
    run = last_run(pipeline) if run is None else run
    vacuumed = None
    if run:
        vacuumed = (datetime.fromisoformat(str(run["finished_at"])), float(run["retain_hours"]))  # type: ignore[arg-type]
    shape = table_shape(path, vacuumed)
    return None if shape is None else shape.oldest_readable_version


def _maintain_table(spark: SparkSession, pipeline: PipelineConfig, role: str, path: str, hours: float,
                    apply_properties: bool) -> TableMaintenance:
    from delta.tables import DeltaTable
    from pyspark.errors import AnalysisException

    done = TableMaintenance(role, path)
    if not delta_table_exists(spark, path):
        done.skipped = "no table yet"
        return done
    started = time.monotonic()
    table = DeltaTable.forPath(spark, path)
    if apply_properties:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in pipeline.maintenance.table_properties().items())
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({props})")
    done.files_before = _file_count(spark, path)

    # Step 1. Compact.
    optimize = table.optimize()
    clustering = {"target": pipeline.maintenance.zorder_by, "ledger": ("batch_id",)}.get(role, ())
    try:
        metrics = (optimize.executeZOrderBy(*clustering) if clustering else optimize.executeCompaction()).collect()
    except _conflicts() as error:
        raise TransientError(f"compaction of {path} lost a race against another compaction (two `tidemark "
                             f"maintain {pipeline.name}` at once?); nothing changed, run it again") from error
    done.compacted_away = int(metrics[0]["metrics"]["numFilesRemoved"]) if metrics else 0

    # Step 2. Vacuum.
    try:
        table.vacuum(hours)
    except AnalysisException as error:  # pragma: no cover - Delta's own retention check (an older table)
        if "retention" not in str(error).lower():
            raise
        raise ConfigError(
            f"Delta refused VACUUM of {path} with {hours:g} hours: the table's "
            "delta.deletedFileRetentionDuration is longer (it was created before maintenance settings). Run "
            f"`tidemark maintain {pipeline.name} --apply-properties` once, or raise "
            "maintenance.time_travel_hours") from None
    recent = table.history(HISTORY_WINDOW).select("version", "operation", "operationMetrics").collect()
    ends = [r for r in recent if r.operation == "VACUUM END"]  # ingest's commits may have followed it
    done.vacuumed = int((ends[0].operationMetrics or {}).get("numDeletedFiles", 0)) if ends else 0
    done.files_after = _file_count(spark, path)
    done.version = int(recent[0].version)
    done.seconds = round(time.monotonic() - started, 3)
    return done


def _conflicts() -> tuple[type[BaseException], ...]:
    from delta import exceptions as dx

    return (dx.ConcurrentDeleteReadException, dx.ConcurrentDeleteDeleteException,
            dx.DeltaConcurrentModificationException)


def _file_count(spark: SparkSession, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("numFiles").first()[0])  # type: ignore[index]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
