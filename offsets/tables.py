"""Questions about tables: existence and small files through Hadoop (so object stores
work too), and each table's ``txn`` state through delta-rs.

Does a Delta table exist at a path — asked in a way that sees other processes' commits.

``DeltaTable.isDeltaTable`` answers from the session's cached ``DeltaLog`` without
refreshing it: once a process has looked at a path whose ``_delta_log`` was still empty
(a rival's first commit in progress), it keeps answering False after the table exists.
So a negative answer is checked against the file system (through Hadoop, so object
stores work too): a commit or checkpoint file in ``_delta_log`` means the table exists,
and the next read of it refreshes the cached log. Probing with a failing ``load`` would
work as well, but makes Spark log an error for every absent table.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tidemark.storage import arrow_filesystem, delta_rs_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def delta_table_exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        return True
    log_dir, fs = _hadoop_path(spark, path.rstrip("/") + "/_delta_log")
    if not fs.exists(log_dir):
        return False
    names = (status.getPath().getName() for status in fs.listStatus(log_dir))
    return any(name.endswith(".json") or ".checkpoint" in name for name in names)


def _hadoop_path(spark: SparkSession, path: str):  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    target = jvm.org.apache.hadoop.fs.Path(path)
    return target, target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]


def write_small_file(spark: SparkSession, path: str, data: bytes) -> None:
    """Write (replace) a small file through Hadoop, so it lands wherever the tables live."""
    target, fs = _hadoop_path(spark, path)
    out = fs.create(target, True)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_small_file(spark: SparkSession, path: str) -> bytes | None:
    """A small file's bytes through Hadoop, or None if it does not exist.

    Another process may replace the file while it is read. On S3, S3A then refuses the read
    (``RemoteFileChangedException``: the object's ETag changed between open and GET) rather
    than mix two versions; it is read again, whole, from the newer one.
    """
    from py4j.protocol import Py4JJavaError

    target, fs = _hadoop_path(spark, path)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for attempt in range(5):
        if not fs.exists(target):
            return None
        try:
            stream = fs.open(target)
            try:
                return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()
        except Py4JJavaError as error:
            name = error.java_exception.getClass().getName()
            if name.endswith("FileNotFoundException"):
                continue  # replaced or removed between the check and the open: look again
            if not name.endswith("RemoteFileChangedException") or attempt == 4:
                raise
    return None


def txn_version(path: str, app_id: str) -> int | None:
    """The newest ``txnVersion`` the Delta table at ``path`` records for ``app_id``, or None.

    Read from the table's ``txn`` state by delta-rs (the ``deltalake`` package, no JVM):
    the newest checkpoint plus the commits after it, so the cost does not grow with the
    table's history, and unlike a search of recent ``commitInfo`` the answer survives log
    cleanup and any number of other writers' commits (compaction, a second pipeline).
    Object stores take their credentials from the environment, as delta-rs reads them.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, storage_options=delta_rs_options(path))
    except TableNotFoundError:
        return None  # no table yet, or its first commit still in flight
    return table.transaction_version(app_id)


def checkpoint_if_due(path: str, every: int) -> int | None:
    """Checkpoint the Delta table at ``path`` by delta-rs if ``every`` versions have passed since its
    newest checkpoint; the version checkpointed, or None.

    Why not Spark's own: delta-spark checkpoints inside the commit that reaches its interval
    (a post-commit hook: a Spark job over the whole state, then Parquet), seconds on a small
    table, so every tenth batch took twice as long and set a follower's freshness tail.
    delta-rs writes the same checkpoint in tens of milliseconds, after the commit, which is
    already visible. Tidemark's tables are created with ``delta.checkpointInterval`` at
    ``tidemark.config.SPARK_CHECKPOINT_FACTOR`` times ``every``, so Spark's in-commit checkpoint, which
    also deletes expired log files, still comes, rarely. A checkpoint carries the ``txn``
    actions, so the fence and recovery read the same state from it as from Spark's.
    """
    import json

    from deltalake import DeltaTable

    table = DeltaTable(path, storage_options=delta_rs_options(path))
    version = table.version()
    last = read_text(path.rstrip("/") + "/_delta_log/_last_checkpoint")
    newest = int(json.loads(last)["version"]) if last else 0
    if version - newest < every:
        return None
    table.create_checkpoint()
    return version


#: What the warm-up computes a snapshot's state under (its own copy of the session's settings):
#: a few small jobs over a wide, nested schema cost less CPU interpreted and planned once
#: (docs/benchmarks.md, "Snapshot state computed ahead"). The results are the same either way;
#: the table's own reads and writes keep Spark's defaults.
WARM_SETTINGS = {"spark.sql.codegen.factoryMode": "NO_CODEGEN", "spark.sql.adaptive.enabled": "false"}

_warm_sessions: weakref.WeakKeyDictionary[SparkSession, Any] = weakref.WeakKeyDictionary()


def warm_snapshot(spark: SparkSession, path: str) -> int:
    """Compute the state of the newest snapshot of the Delta table at ``path`` in this session;
    its version.

    Why: delta-spark answers an append's ``txnAppId`` check from the snapshot's full state
    (``Snapshot.transactions``), which Spark rebuilds from the checkpoint and the newer
    commits in three small jobs, and every commit or checkpoint installs a new snapshot
    with none computed: the append waited for those jobs inside step 4 (docs/benchmarks.md,
    "Snapshot state computed ahead"). Computed here after step 6, on the snapshot the
    session's cached ``DeltaLog`` holds, the next append's ``update()`` finds the same
    snapshot (nothing new in the log) with its state ready; if another writer committed
    meanwhile, the append builds a new one as it always did. Read-only: no effect on the
    table, safe to lose at any instant.

    Delta builds the state in the JVM thread's active session, so this thread makes a
    copy of ``spark`` with :data:`WARM_SETTINGS` active for the computation, and puts back
    whatever was active before (the thread may be reused).
    """
    jvm: Any = spark._jvm
    sessions = jvm.org.apache.spark.sql.SparkSession
    warm = _warm_sessions.get(spark)
    if warm is None:
        warm = spark._jsparkSession.cloneSession()
        for key, value in WARM_SETTINGS.items():
            warm.conf().set(key, value)
        _warm_sessions[spark] = warm
    before = sessions.getActiveSession()
    sessions.setActiveSession(warm)
    try:
        snapshot = cached_snapshot(spark, path)
        snapshot.transactions()
        return int(snapshot.version())
    finally:
        if before.isDefined():
            sessions.setActiveSession(before.get())
        else:
            sessions.clearActiveSession()


def cached_snapshot(spark: SparkSession, path: str) -> Any:
    """The newest snapshot (a py4j handle) of the session's cached ``DeltaLog`` for ``path``: the one an
    append's own ``update()`` finds when nothing new is in the log."""
    jvm: Any = spark._jvm
    none = jvm.scala.Option.empty()
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).update(False, none, none)


def maintenance_marker(ledger_path: str, pipeline: str) -> str:
    """Where ``tidemark maintain`` records its last run (beside the ledger; VACUUM skips ``_`` folders)."""
    return f"{ledger_path.rstrip('/')}/_tidemark_maintenance/{pipeline}.json"


@dataclass(frozen=True)
class TableShape:
    """What a table costs to commit to and what it still lets you read (``tidemark status``)."""

    path: str
    version: int
    files: int
    bytes: int
    oldest_readable_version: int
    """The oldest version whose log and data files are all still there (time travel works from here)."""
    columns: int = 0
    """How many columns the table's current schema has."""

    @property
    def mean_file_bytes(self) -> int:
        return self.bytes // self.files if self.files else 0


def table_shape(path: str, vacuumed: tuple[datetime, float] | None = None) -> TableShape | None:
    """The shape of the Delta table at ``path`` by delta-rs (no JVM), or None if it does not exist.

    ``vacuumed`` is the last VACUUM's (time, retention hours): it kept every file some version
    active at or after ``time - retention`` reads, so the version active then is the oldest
    whose files are whole. Log cleanup bounds it too: a version needs a checkpoint at or
    below it (or the log from version 0). Commit times come from the commit files'
    modification times, as Delta's own time travel takes them.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, storage_options=delta_rs_options(path))
    except TableNotFoundError:
        return None
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    commits, checkpoints = _log_listing(path)
    oldest = 0 if 0 in commits else min(checkpoints or commits or [table.version()])
    if vacuumed is not None:
        cutoff = (vacuumed[0] - timedelta(hours=vacuumed[1])).timestamp()
        active_then = [v for v, mtime in commits.items() if mtime <= cutoff]
        if active_then:
            oldest = max(oldest, max(active_then))
    return TableShape(path, table.version(), len(sizes), int(sum(sizes)), oldest, len(table.schema().fields))


def _log_listing(path: str) -> tuple[dict[int, float], list[int]]:
    """The ``_delta_log``'s commit versions (with modification times, epoch seconds) and checkpoint versions."""
    import pyarrow.fs as pafs

    fs, root = arrow_filesystem(path.rstrip("/") + "/_delta_log")
    commits: dict[int, float] = {}
    checkpoints: list[int] = []
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        name = info.base_name
        head = name.split(".", 1)[0]
        if not head.isdigit():
            continue
        if name.endswith(".json") and name.count(".") == 1:
            commits[int(head)] = info.mtime.timestamp() if info.mtime else 0.0
        elif ".checkpoint" in name:
            checkpoints.append(int(head))
    return commits, checkpoints


def read_text(path: str) -> str | None:
    """A small file's text through pyarrow (no JVM), or None if it does not exist."""
    import pyarrow.fs as pafs

    fs, where = arrow_filesystem(path)
    if fs.get_file_info(where).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(where) as stream:
        return bytes(stream.read()).decode()
