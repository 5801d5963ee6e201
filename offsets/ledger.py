"""The intent ledger: one Delta row per batch, written before the batch's data.

A row says exactly what batch ``N`` of a pipeline is: the offset range ``[start, end)``
of every partition (already cut at source-transaction boundaries, G3), the time stamped
into its rows, and the other decisions a replay must repeat rather than re-make: which
incomplete transactions were released, and which table version dedup looked ids up in.
It also carries what the next plan needs: since when each source transaction with
events missing at the readable frontier has been waiting. Rows are append-only, so any
past batch can be re-read bit for bit (backfill, G6), and each append carries
``txnAppId=<pipeline>``/``txnVersion=N``, so two writers cannot both claim ``N``.

A *seek* is a batch like any other, claimed under the same fence, whose ranges are empty
and whose ends are where an operator moved the pipeline (``tidemark offsets seek``): the
next batch starts there. It records every partition it moved, from where to where, so the
records it skipped or gives to be read again stay on the record (:class:`Seek`).

A *guarded* intent (G3 checked by its write instead of a planning scan) whose check
failed gets one *revision*: the same batch re-planned with the scan, appended with
``txnAppId=<pipeline>#revision``. The revision replaces the guarded row wherever the
ledger is read; both stay in the table as the record of what happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from offsets.tables import delta_table_exists
from tidemark.errors import TerminalError
from tidemark.storage import delta_rs_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

TP = tuple[str, int]

_RANGES_TYPE = "ARRAY<STRUCT<topic: STRING, partition: INT, start_offset: BIGINT, end_offset: BIGINT>>"
LEDGER_SCHEMA = (
    f"pipeline STRING, batch_id BIGINT, writer STRING, planned_at TIMESTAMP, ranges {_RANGES_TYPE}, decisions STRING"
)


class OffsetRegressionError(TerminalError):
    """A planned range would move a partition's offset backwards; the ledger is inconsistent."""


class LedgerMismatchError(TerminalError):
    """The target holds batches its ledger does not: the ledger was deleted, replaced or restored."""


@dataclass(frozen=True, order=True)
class Range:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def span(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Wait:
    """A source transaction missing events at the readable frontier, as the ledger carries it (G3)."""

    since: datetime
    """``planned_at`` of the first batch that found events of it missing below every LSO: its wait
    counts from here (not from the events' age), and restarts neither reset nor shorten it."""
    searched: Mapping[TP, int]
    """Per partition that may hold the missing events: searched up to here (the LSO then)."""
    found: frozenset[int] = frozenset()
    """Positions of its events known to be readable."""

    def to_dict(self) -> dict[str, object]:
        return {"since": self.since.isoformat(), "found": sorted(self.found),
                "searched": {f"{t}:{p}": o for (t, p), o in sorted(self.searched.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Wait:
        searched = data.get("searched") or {}
        assert isinstance(searched, dict)
        return cls(since=datetime.fromisoformat(str(data["since"])).astimezone(UTC),
                   searched={(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])): int(v) for k, v in searched.items()},
                   found=frozenset(int(p) for p in data.get("found") or ()))  # type: ignore[attr-defined]


@dataclass(frozen=True, order=True)
class Move:
    """One partition an operator's seek moved: from the offset the pipeline had reached
    (None: it had read nothing there yet) to the offset its next batch starts at."""

    topic: str
    partition: int
    old: int | None
    new: int

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Seek:
    """What an operator's seek did (``tidemark offsets seek``), as the ledger keeps it."""

    moves: tuple[Move, ...]
    reason: str
    """How the new offsets were chosen, as the operator asked: ``--to earliest``, ``--to-timestamp ...``."""

    def skipped(self) -> list[Range]:
        """Ranges passed over forwards: records the table will not hold, by the operator's choice."""
        return [Range(m.topic, m.partition, m.old, m.new) for m in self.moves if m.old is not None and m.new > m.old]

    def reread(self) -> list[Range]:
        """Ranges moved back over: records read again (duplicates, with dedup)."""
        return [Range(m.topic, m.partition, m.new, m.old) for m in self.moves if m.old is not None and m.new < m.old]

    def to_dict(self) -> dict[str, object]:
        return {"reason": self.reason, "moves": [[m.topic, m.partition, m.old, m.new] for m in sorted(self.moves)]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Seek:
        return cls(moves=tuple(Move(str(t), int(p), None if o is None else int(o), int(n))
                               for t, p, o, n in data.get("moves") or ()),
                   reason=str(data.get("reason", "")))


@dataclass(frozen=True)
class Schemas:
    """``format: avro``: the schemas a batch is decoded with, fixed when it is planned, so that a
    replay after a crash decodes the same records into the same rows (ids never change what they
    name in a registry)."""

    subject: str
    writers: tuple[int, ...]
    """The ids of the subject's versions when the batch was planned, after its LSO snapshot: every
    record below that LSO was written with a schema registered before it, so a record's id
    that is not here is not a version of the subject."""
    reader: int
    """The id every record is read into: the subject's newest version then."""

    def to_dict(self) -> dict[str, object]:
        return {"subject": self.subject, "writers": list(self.writers), "reader": self.reader}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schemas:
        return cls(str(data["subject"]), tuple(int(i) for i in data["writers"]), int(data["reader"]))


@dataclass(frozen=True)
class Intent:
    pipeline: str
    batch_id: int
    writer: str
    planned_at: datetime
    ranges: tuple[Range, ...]
    released: tuple[str, ...] = ()
    """Source transactions written incomplete, past their timeout (G3 policy)."""
    held: int = 0
    """How many source transactions the cut left for a later batch (for reports only)."""
    dedup_version: int | None = None
    """Target table version whose event ids this batch's dedup excludes (-1: no table yet)."""
    guarded: bool = False
    """G3 not cut by a planning scan: the write checks that no record belongs to a multi-event
    source transaction, and aborts before its commit if one does (offsets.protocol, step 4)."""
    txns: int | None = None
    """Multi-event source transactions the planning scan saw in the proposed ranges (None: no scan)."""
    waiting: Mapping[str, Wait] = field(default_factory=dict)
    """Source transactions missing events at the readable frontier, and since when (G3's timeout)."""
    manifest: tuple[int, int, int] | None = None
    """G3 from the relay's manifest: the manifest offsets ``[from, to)`` read for this batch (its
    write is guarded against any transaction they do not list), and where the next batch reads from."""
    seek: Seek | None = None
    """An operator's seek: this batch reads nothing, and its ends are where the next batch starts."""
    schemas: Schemas | None = None
    """``format: avro``: the writer and reader schemas the batch decodes with."""

    def ends(self) -> dict[TP, int]:
        return {r.tp: r.end for r in self.ranges}

    @property
    def is_empty(self) -> bool:
        return all(r.span == 0 for r in self.ranges)

    def to_json(self, *, write: str | None = None) -> str:
        """Compact form stored as a commit's ``userMetadata``; ``write`` tags one append attempt."""
        meta: dict[str, object] = {
            "tidemark": 1, "pipeline": self.pipeline, "batch": self.batch_id,
            "offsets": {f"{r.topic}:{r.partition}": [r.start, r.end] for r in self.ranges if r.span},
        }
        if write is not None:
            meta["write"] = write
        return json.dumps(meta, separators=(",", ":"), sort_keys=True)

    def row(self) -> tuple[object, ...]:
        # An aware datetime is stored as its instant; a naive one would be read as local time.
        return (self.pipeline, self.batch_id, self.writer, self.planned_at,
                [(r.topic, r.partition, r.start, r.end) for r in self.ranges], self.decisions_json())

    def decisions_json(self) -> str:
        decisions: dict[str, object] = {"released": list(self.released), "held": self.held,
                                        "dedup_version": self.dedup_version, "guarded": self.guarded,
                                        "txns": self.txns}
        if self.waiting:
            decisions["waiting"] = {txn: w.to_dict() for txn, w in sorted(self.waiting.items())}
        if self.manifest is not None:
            decisions["manifest"] = list(self.manifest)
        if self.seek is not None:
            decisions["seek"] = self.seek.to_dict()
        if self.schemas is not None:
            decisions["schemas"] = self.schemas.to_dict()
        return json.dumps(decisions, separators=(",", ":"), sort_keys=True)

    def starts_waiting(self, last: Intent | None) -> bool:
        """Does this intent start the wait of a transaction ``last`` did not carry? (Then even an
        empty batch is claimed, or the next run would start that wait again.)"""
        return bool(set(self.waiting) - set(last.waiting if last else ()))


def commit_metadata(user_metadata: str | None, pipeline: str) -> dict[str, object] | None:
    """Tidemark's metadata of a commit written for ``pipeline`` (``batch`` is an int), or None."""
    if not user_metadata:
        return None
    try:
        meta = json.loads(user_metadata)
    except ValueError:
        return None
    if isinstance(meta, dict) and meta.get("tidemark") == 1 and meta.get("pipeline") == pipeline \
            and isinstance(meta.get("batch"), int):
        return meta
    return None


def batch_of_commit(user_metadata: str | None, pipeline: str) -> int | None:
    """The batch id a commit records for ``pipeline``, or None."""
    meta = commit_metadata(user_metadata, pipeline)
    return int(meta["batch"]) if meta else None  # type: ignore[call-overload]


def recent_commits(spark: SparkSession, path: str, pipeline: str,
                   window: int) -> tuple[list[dict[str, object]], int]:
    """``pipeline``'s metadata among a table's newest ``window`` commits (newest first), and how many were read.

    Reads commit files only, never data, so it costs the same however large the table is.
    """
    from delta.tables import DeltaTable

    if not delta_table_exists(spark, path):
        return [], 0
    commits = DeltaTable.forPath(spark, path).history(window).select("userMetadata").collect()
    found = [m for m in (commit_metadata(c.userMetadata, pipeline) for c in commits) if m is not None]
    return found, len(commits)


class Ledger:
    def __init__(self, spark: SparkSession, path: str, pipeline: str, *,
                 table_properties: Mapping[str, str] | None = None) -> None:
        self.spark = spark
        self.path = path
        self.pipeline = pipeline
        self.table_properties = dict(table_properties or {})
        """Delta properties the ledger is created with (ignored by Delta once it exists)."""

    def last(self) -> Intent | None:
        """The newest intent of this pipeline, at a cost that does not grow with the ledger (R2).

        Every claim carries ``txnAppId=<pipeline>``, so the ledger's ``txn`` state names the
        newest batch (``offsets.tables.txn_version``, which also sees a ledger deleted under
        a running session); the row is then found by data skipping on ``batch_id``.
        """
        return read_last(self.path, self.pipeline)

    def get(self, batch_id: int) -> Intent | None:
        found = read_ledger(self.path, self.pipeline, first=batch_id, last=batch_id)
        return found[0] if found else None

    def history(self, first: int | None = None, last: int | None = None) -> list[Intent]:
        """Intents ``first``..``last`` (inclusive; None: unbounded), in batch order.

        Read by delta-rs, like the claim is written: through Spark, a run's first read of
        the ledger builds its snapshot in Spark jobs (docs/benchmarks.md, "The ledger through delta-rs").
        """
        return read_ledger(self.path, self.pipeline, first=first, last=last)

    def _frame(self, intent: Intent) -> DataFrame:
        """``intent`` as one ledger row, built from literals.

        Not ``createDataFrame``: its rows are pickled in Python and unpickled by a Spark
        task, which made a claim ~0.3 s slower (0.77 vs 0.46 s per append, side by side).
        """
        from pyspark.sql import functions as F

        ranges = json.dumps([{"topic": r.topic, "partition": r.partition, "start_offset": r.start,
                              "end_offset": r.end} for r in intent.ranges])
        return self.spark.range(0, 1, 1, 1).select(
            F.lit(intent.pipeline).alias("pipeline"), F.lit(intent.batch_id).cast("bigint").alias("batch_id"),
            F.lit(intent.writer).alias("writer"),
            # An aware datetime is the instant; a naive one would be read as local time.
            F.lit(intent.planned_at).cast("timestamp").alias("planned_at"),
            F.from_json(F.lit(ranges), _RANGES_TYPE).alias("ranges"),
            F.lit(intent.decisions_json()).alias("decisions"))

    def append(self, intent: Intent, *, write: str | None = None, revision: bool = False,
               observation: Observation | None = None) -> bool | None:
        """Append ``intent`` unless this pipeline already claimed (or revised) that batch id.

        Returns True when this call committed the row and False when it did not (the batch
        id was held already, or a rival's commit with the same ``txnAppId`` won the race);
        None when only ``observation`` (a count, filled only if the append ran its job) and
        history can tell: an append that must add a column to a ledger from before
        ``decisions``, and one whose creation of the ledger lost a race, go through Spark.
        ``write`` tags the commit's metadata, so the caller can tell its own commit from a
        rival's in history.

        Every other append is written by delta-rs: the same row, ``txn`` action and
        ``userMetadata`` as Spark's, without Spark's ``txnAppId`` append rebuilding the ledger's
        whole snapshot state to look its app up (docs/benchmarks.md, "The ledger through
        delta-rs"). The fence is the same: the app's version is read
        from the snapshot the commit is made against, and delta-rs refuses the commit if any
        commit since then carries a ``txn`` of this app (Delta's concurrent-transaction
        conflict, as Spark's own check does). The first append creates the ledger the same
        way (version 0 is written only if absent), with the schema and properties Spark's
        would give it, sparing a new pipeline's first `tidemark ingest` Spark's jobs in a cold JVM.
        """
        if revision and intent.guarded:
            raise ValueError("a revision is a scanned plan; it cannot be guarded again")
        app_id = f"{self.pipeline}#revision" if revision else self.pipeline
        metadata = intent.to_json(write=write)
        committed = self._append_without_spark(intent, app_id, metadata)
        if committed is not None:
            return committed
        from pyspark.sql import functions as F

        df = self._frame(intent)
        if observation is not None:
            df = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        (df.write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", intent.batch_id)
         .option("userMetadata", metadata)
         .option("mergeSchema", "true")  # ledgers from before `decisions` gain the column
         .options(**self.table_properties).save(self.path))
        return None

    def _append_without_spark(self, intent: Intent, app_id: str, metadata: str) -> bool | None:
        """The append by delta-rs (see :meth:`append`); None if the ledger lacks a column or a rival created it."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

        row = {"pipeline": intent.pipeline, "batch_id": intent.batch_id, "writer": intent.writer,
               "planned_at": intent.planned_at.astimezone(UTC),
               "ranges": [{"topic": r.topic, "partition": r.partition, "start_offset": r.start,
                           "end_offset": r.end} for r in intent.ranges],
               "decisions": intent.decisions_json()}

        def commit(**retries: int) -> CommitProperties:
            return CommitProperties(custom_metadata={"userMetadata": metadata},
                                    app_transactions=[Transaction(app_id, intent.batch_id)], **retries)

        try:
            # the snapshot the commit is checked against
            table = DeltaTable(self.path, storage_options=delta_rs_options(self.path))
        except TableNotFoundError:
            # No retry: delta-rs would retry a create that lost the race for version 0 as
            # version 1, with a second txn of the same batch (a test caught two claims).
            try:
                write_deltalake(self.path, pa.Table.from_pylist([row], schema=_arrow_schema()), mode="error",
                                storage_options=delta_rs_options(self.path),
                                configuration=self.table_properties or None,
                                commit_properties=commit(max_commit_retries=0))
            except DeltaError:
                # A rival created it first (or the store refused): Spark's append decides, with
                # its txn check against whatever the ledger now holds.
                return None
            return True
        schema = pa.schema(table.schema().to_arrow())
        if set(schema.names) != set(row):
            return None
        if (table.transaction_version(app_id) or 0) >= intent.batch_id:
            return False
        try:
            write_deltalake(table, pa.Table.from_pylist([row], schema=schema), mode="append",
                            commit_properties=commit())
        except CommitFailedError:
            return False  # a commit since our snapshot carries this app's txn: a rival's claim
        return True


def _arrow_schema() -> Any:
    """:data:`LEDGER_SCHEMA` in Arrow, as delta-rs creates a ledger (every column nullable, as
    Spark's Delta writer makes a new table's; ``planned_at`` an instant in UTC: Delta's ``timestamp``)."""
    import pyarrow as pa

    return pa.schema([
        ("pipeline", pa.string()), ("batch_id", pa.int64()), ("writer", pa.string()),
        ("planned_at", pa.timestamp("us", tz="UTC")),
        ("ranges", pa.list_(pa.struct([("topic", pa.string()), ("partition", pa.int32()),
                                       ("start_offset", pa.int64()), ("end_offset", pa.int64())]))),
        ("decisions", pa.string())])


def _intent(row: Mapping[str, Any]) -> Intent:
    """A ledger row (from Spark or from Arrow: a mapping of its columns) as an :class:`Intent`."""
    # Ledgers written before decisions existed have no such column (or null in it).
    decisions = json.loads(row.get("decisions") or "{}")
    planned_at: datetime = row["planned_at"]
    return Intent(
        pipeline=row["pipeline"], batch_id=int(row["batch_id"]), writer=row["writer"],
        # PySpark returns local naive time, Arrow an aware UTC instant: both are the same instant here.
        planned_at=planned_at.astimezone(UTC),
        ranges=tuple(sorted(Range(r["topic"], int(r["partition"]), int(r["start_offset"]), int(r["end_offset"]))
                            for r in row["ranges"])),
        released=tuple(decisions.get("released", ())), held=int(decisions.get("held", 0)),
        dedup_version=decisions.get("dedup_version"), guarded=bool(decisions.get("guarded", False)),
        txns=decisions.get("txns"),
        waiting={txn: Wait.from_dict(w) for txn, w in (decisions.get("waiting") or {}).items()},
        manifest=tuple(decisions["manifest"]) if decisions.get("manifest") else None,  # type: ignore[arg-type]
        seek=Seek.from_dict(decisions["seek"]) if decisions.get("seek") else None,
        schemas=Schemas.from_dict(decisions["schemas"]) if decisions.get("schemas") else None,
    )


def _merged(intents: Iterable[Intent]) -> list[Intent]:
    """One intent per batch, in batch order: a batch has one claim and at most one revision (never guarded),
    and the revision is the batch wherever the ledger is read."""
    by_batch: dict[int, Intent] = {}
    for intent in intents:
        known = by_batch.get(intent.batch_id)
        if known is None or (known.guarded and not intent.guarded):
            by_batch[intent.batch_id] = intent
    return [by_batch[b] for b in sorted(by_batch)]


def read_ledger(path: str, pipeline: str, *, first: int | None = None, last: int | None = None) -> list[Intent]:
    """Intents ``first``..``last`` of ``pipeline``, read by delta-rs (the ``deltalake`` package) with no JVM.

    What :class:`Ledger` reads, and what the operator's commands (``tidemark status``,
    ``tidemark offsets show``) read without starting Spark at all. Data skipping on
    ``pipeline`` and ``batch_id`` keeps a read of the newest batch from growing with the
    ledger. Object stores take their credentials from the environment, as delta-rs reads them.
    """
    table = _open(path)
    return [] if table is None else _read(table, pipeline, first, last)


def read_last(path: str, pipeline: str) -> Intent | None:
    """The newest intent of ``pipeline`` (as :meth:`Ledger.last`), with no JVM.

    The ledger's ``txn`` state names the newest batch (as ``offsets.tables.txn_version``
    reads it); its row comes from the same snapshot, so the log is loaded once.
    """
    table = _open(path)
    newest = None if table is None else table.transaction_version(pipeline)
    if table is None or newest is None:
        return None
    found = _read(table, pipeline, newest, newest)
    return found[0] if found else None


def _open(path: str) -> Any:
    """The newest snapshot of the Delta table at ``path`` (delta-rs), or None if there is no table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, storage_options=delta_rs_options(path))
    except TableNotFoundError:
        return None


def _read(table: Any, pipeline: str, first: int | None, last: int | None) -> list[Intent]:
    filters: list[tuple[str, str, Any]] = [("pipeline", "=", pipeline)]
    if first is not None:
        filters.append(("batch_id", ">=", int(first)))
    if last is not None:
        filters.append(("batch_id", "<=", int(last)))
    names = {f.name for f in table.schema().fields}
    columns: list[str] = [c for c in ("pipeline", "batch_id", "writer", "planned_at", "ranges", "decisions")
                          if c in names]
    rows = table.to_pyarrow_table(columns=columns, filters=filters).to_pylist()
    return _merged(_intent(row) for row in sorted(rows, key=lambda r: r["batch_id"]))


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
