"""``tidemark status``: every pipeline and the relay on one screen.

Read-only and cheap: the newest ledger intent per pipeline (a cost that does not grow
with history), Kafka's offsets, the last audit's recorded verdict, and the relay's
position and slot. No JVM: the ledger is read by delta-rs (``offsets.ledger.read_last``),
so the screen answers in about a second instead of the ~10 s a Spark session takes to
start. A part that cannot be read (no ledger yet, no outbox, Kafka down) shows why
instead of failing the whole screen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from offsets.lag import PartitionLag, partition_lags
from offsets.ledger import Intent, read_last
from offsets.tables import TableShape, table_shape, txn_version
from orchestration.context import PipelineContext, resolve_bootstrap
from quality.audit import last_verdict
from tidemark.config import TidemarkConfig
from tidemark.errors import TidemarkError


@dataclass
class PipelineStatus:
    name: str
    target: str
    partitions: list[PartitionLag] = field(default_factory=list)
    last_batch: str = "-"
    quality: str = "never audited"
    problem: str | None = None
    tables: dict[str, TableShape] = field(default_factory=dict)
    """Per role (target, quarantine, ledger) that exists: versions, files, bytes, oldest readable version."""
    maintained: str = "never"
    """When ``tidemark maintain`` last finished, and its retention."""
    held: str | None = None
    """What the newest batch holds back (G3): source transactions waiting for missing events, and
    those whole in Kafka left for a later batch; None when nothing is held."""
    schema: str = "-"
    """What the newest batch decoded with (``format: avro``: the subject's schema ids) and how many
    columns the target's schema has now."""

    @property
    def lag(self) -> int | None:
        return sum(p.lag for p in self.partitions) if self.partitions else None

    def to_dict(self) -> dict[str, object]:
        """For ``--json``: every field, the total lag, and per partition its offsets."""
        data = {**asdict(self), "lag": self.lag}
        data["tables"] = {role: {**asdict(t), "mean_file_bytes": t.mean_file_bytes} for role, t in self.tables.items()}
        return data


def pipeline_status(ctx: PipelineContext, quality_dir: Path) -> PipelineStatus:
    p = ctx.pipeline
    status = PipelineStatus(p.name, p.target)
    verdict = last_verdict(quality_dir, p.name)
    if verdict is not None:
        status.quality = (("PASS" if verdict["passed"] else f"FAIL ({len(verdict['failed'])} checks)")
                          + f" at {verdict['at']}")
    try:
        last = read_last(p.ledger_path, p.name)
        if last is not None:
            status.last_batch = (f"#{last.batch_id} planned {last.planned_at.isoformat(timespec='seconds')}, "
                                 f"{sum(r.span for r in last.ranges)} offsets")
            if not last.is_empty and (txn_version(p.target, p.name) or 0) < last.batch_id:
                status.last_batch += " (claimed, not in the target yet: being written, or recovered by the next run)"
        status.partitions = partition_lags(ctx.client_config, p, last.ends() if last else {})
        status.held = held_back(last)
    except TidemarkError as exc:
        status.problem = str(exc).splitlines()[0]
        last = None
    _table_shapes(status, ctx)
    status.schema = schema_summary(p.format, last, status.tables.get("target"))
    return status


def held_back(last: Intent | None) -> str | None:
    """What ``last`` left for later batches, in a line: the transactions missing events (by id,
    with when their wait began) and how many whole ones a cut left for the next batch."""
    if last is None or not (last.waiting or last.held):
        return None
    parts = []
    if last.waiting:
        oldest = min(w.since for w in last.waiting.values())
        parts.append(f"{len(last.waiting)} source transaction(s) missing events since "
                     f"{oldest.isoformat(timespec='seconds')}: " + ", ".join(sorted(last.waiting)[:3])
                     + (" ..." if len(last.waiting) > 3 else ""))
    whole = last.held - len(last.waiting)
    if whole > 0:
        parts.append(f"{whole} whole one(s) left for the next batch")
    return "; ".join(parts)


def schema_summary(fmt: str, last: Intent | None, target: TableShape | None) -> str:
    """``tidemark status``'s schema column: the batch's schema ids (Avro, Protobuf) and the target's columns."""
    parts = []
    if last is not None and last.schemas is not None:
        s = last.schemas
        others = [str(i) for i in s.writers if i != s.reader]
        parts.append(f"{s.subject}: id {s.reader}" + (f" (also reads ids {', '.join(others)})" if others else ""))
    elif fmt in ("avro", "protobuf"):
        parts.append("no batch yet")
    if target is not None:
        parts.append(f"target {target.columns} columns")
    return "; ".join(parts) or "-"


def _table_shapes(status: PipelineStatus, ctx: PipelineContext) -> None:
    """Each table's shape and the last maintenance run; a table that cannot be read is left out."""
    from pipelines.maintain import last_run, tables_of, vacuumed

    p = ctx.pipeline
    try:
        run = last_run(p)
    except OSError:
        run = None
    if run:
        status.maintained = f"{run['finished_at']} (retention {float(run['retain_hours']):g} h)"  # type: ignore[arg-type]
    for role, path in tables_of(p):
        try:
            shape = table_shape(path, vacuumed(run, role))
        except Exception as exc:  # noqa: BLE001 - an unreadable table must not hide the rest of the screen
            status.problem = status.problem or f"{role} table {path} unreadable: {exc}".splitlines()[0]
            continue
        if shape is not None:
            status.tables[role] = shape


def relay_summary(config: TidemarkConfig, dsn: str) -> dict[str, str]:
    from connectors.kafka_config import librdkafka_config
    from outbox.status import relay_status

    try:
        own = config.for_relay()  # the relay's own credentials, if it has any
        return relay_status(config.relay, dsn=dsn, client_config=librdkafka_config(own.kafka, resolve_bootstrap(own)))
    except TidemarkError as exc:
        return {"relay": config.relay.id, "state": str(exc).splitlines()[0]}
    except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: say so, keep the screen
        return {"relay": config.relay.id, "state": f"unavailable: {type(exc).__name__}: {exc}".splitlines()[0]}
