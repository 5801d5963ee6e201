"""A Spark driver process of the S3 tests (``tests/integration/test_s3_commits.py``).

``python -m tests.s3_child race LOG_DIR WRITER OTHER VERSIONS BARRIER STORE OUT``: for each
version, meet the other writer at a file barrier (so both try the version at the same moment),
then ``LogStore.write`` the version's commit file without overwrite, holding the writer's name,
and record whether the store said it committed.

``python -m tests.s3_child append TABLE WRITER COMMITS OUT``: append ``COMMITS`` one-row commits
``(writer, seq)`` to the Delta table through Delta's own write path.

``python -m tests.s3_child vacuum TABLE OUT``: three appends, a compaction, VACUUM with no retention.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path


def _meet(barrier: Path, writer: str, other: str, version: int, timeout: float = 120) -> None:
    (barrier / f"{writer}.{version}").touch()
    deadline = time.monotonic() + timeout
    while not (barrier / f"{other}.{version}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{other} never reached version {version}")
        time.sleep(0.0005)


def _session(name: str):  # type: ignore[no-untyped-def]
    from infra.spark import build_session
    from tidemark.settings import load_settings

    return build_session(load_settings(), name, extra={"spark.master": "local[1]"})


def append(table: str, writer: str, commits: str, out: str) -> int:
    spark = _session(f"s3-append-{writer}")
    for seq in range(int(commits)):
        spark.createDataFrame([(writer, seq)], "writer STRING, seq INT").write.format("delta").mode("append").save(table)
    Path(out).write_text(json.dumps({"writer": writer, "commits": int(commits)}))
    spark.stop()
    return 0


def vacuum(table: str, out: str) -> int:
    """Three appends, a compaction, then VACUUM with no retention: what is left must still be the table."""
    from delta.tables import DeltaTable

    spark = _session("s3-vacuum")
    for seq in range(3):
        spark.createDataFrame([("a", seq)], "writer STRING, seq INT").write.format("delta").mode("append").save(table)
    delta = DeltaTable.forPath(spark, table)
    delta.optimize().executeCompaction()
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    delta.vacuum(0.0)
    rows = spark.read.format("delta").load(table).count()
    Path(out).write_text(json.dumps({"rows": rows}))
    spark.stop()
    return 0


def race(log_dir: str, writer: str, other: str, versions: str, barrier: str, store_class: str, out: str) -> int:
    from py4j.protocol import Py4JJavaError

    spark = _session(f"s3-race-{writer}")
    jvm = spark._jvm
    assert jvm is not None
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    store = functools.reduce(getattr, store_class.split("."), jvm)(conf)
    results = []
    for version in range(int(versions)):
        path = jvm.org.apache.hadoop.fs.Path(f"{log_dir.rstrip('/')}/{version:020d}.json")
        lines = jvm.java.util.ArrayList()
        lines.add(json.dumps({"commitInfo": {"writer": writer, "version": version}}))
        _meet(Path(barrier), writer, other, version)
        try:
            store.write(path, lines.iterator(), False, conf)
            won = True
        except Py4JJavaError as exc:
            name = exc.java_exception.getClass().getName()
            if name not in ("java.nio.file.FileAlreadyExistsException",
                            "org.apache.hadoop.fs.FileAlreadyExistsException"):
                raise
            won = False
        results.append({"version": version, "won": won})
    Path(out).write_text(json.dumps(results))
    spark.stop()
    return 0


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    sys.exit({"race": race, "append": append, "vacuum": vacuum}[command](*rest))
