"""A class-data sharing archive for the Spark driver: a JVM start without loading its classes again.

Every ``tidemark ingest``, audit and backfill process starts a JVM that loads, parses and
verifies some 20,000 classes of Spark, Scala, Hadoop and Delta before it reads a record;
a crash-recovering deployment and the SIGKILL tests pay that at every restart. HotSpot can
map those classes, already parsed, from an archive written by an earlier run
(class-data sharing, JDK 13+). Measured on 2 cores: a cold ``tidemark ingest`` of 20,000
records took 11.1 s with the archive against 14.8 s without, a session's start and stop
4.0 s against 6.0 s (``bench/cold_start_bench.py``, docs/benchmarks.md, session 36).

How it stays safe:

1. ``make bootstrap`` (:func:`build`) runs a small training workload in a child process
   whose driver JVM dumps the classes it loaded at exit (``-XX:ArchiveClassesAtExit``) to
   a temporary file; only a complete archive is renamed into place.
2. The archive's name is a hash of everything HotSpot checks it against (:func:`archive_path`):
   the JVM's files, and every jar of the driver's class path in the JVM's order with its
   size and modification time. HotSpot refuses the whole archive, silently, when one jar's
   size or time differs from training, so a reinstalled virtualenv at the same path (new
   times, same names) must name a new archive, not find the old one and lose it; the next
   bootstrap trains anew and deletes archives whose files are gone or changed (:func:`prune`).
3. A session uses it only if it exists (:func:`driver_options`). HotSpot checks an archive
   against its own build and class path before mapping it and otherwise starts without
   it; its CDS log tags are silenced so that fallback prints nothing. An archive changes
   how fast classes load, never which classes or what they do.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.process import java_executable

#: Turns HotSpot's CDS messages off: a mismatched archive is skipped, not worth a line.
_QUIET = "-Xlog:cds*=off"


#: What else Spark's launcher puts on the driver's class path: another value names another archive.
_CLASS_PATH_ENVIRONMENT = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                           "SPARK_PREPEND_CLASSES")


def _java_files() -> list[Path]:
    """The JVM a driver will run (as spark-class picks it: JAVA_HOME, else PATH): the files of its build."""
    try:
        java = Path(java_executable()).resolve()
    except Exception:  # noqa: BLE001 - no java: no archive; Spark will say what is missing
        return []
    home = java.parent.parent
    return [java, *(home / name for name in ("release", "lib/server/libjvm.so", "lib/server/classes.jsa")
                    if (home / name).exists())]


def _checked_files(class_path: tuple[str, ...]) -> list[Path]:
    """Every file HotSpot checks an archive against, in its order: the JVM's, ``class_path``, then
    pyspark's jars as the launcher's ``jars/*`` expands them (directory order, not sorted)."""
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    listed = [Path(entry.path) for entry in os.scandir(shipped) if entry.name.lower().endswith(".jar")] \
        if shipped.is_dir() else []
    return [*_java_files(), *(Path(p) for p in class_path), *listed]


def _stamp(path: Path) -> str:
    """A file as HotSpot recognises it (size and modification time), one line of an archive's key."""
    try:
        stat = path.stat()
    except OSError:
        return f"{path}\t-\t-"
    return f"{path}\t{stat.st_size}\t{stat.st_mtime_ns}"


def _key(class_path: tuple[str, ...]) -> list[str]:
    import pyspark

    settings = [f"{name}={os.environ.get(name, '')}" for name in _CLASS_PATH_ENVIRONMENT]
    return [f"pyspark {pyspark.__version__}", *settings, *(_stamp(f) for f in _checked_files(class_path))]


def archive_path(home: Path, class_path: tuple[str, ...]) -> Path:
    """Where the archive for this JVM and this driver class path, as its files are now, lives (absent until built)."""
    return _named(home, _key(class_path))


def _named(home: Path, key: list[str]) -> Path:
    return home / "jars" / f"cds-{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:12]}.jsa"


def _key_file(archive: Path) -> Path:
    """Beside each archive: the files it was trained on, one :func:`_stamp` line each (for :func:`prune`)."""
    return archive.with_suffix(".key")


#: How long :func:`build` lets a training run. A training's leftover older than this (its
#: partial archive, or its key file without the archive) is a killed one's, never one in progress.
TRAINING_SECONDS = 600.0


def prune(directory: Path, keep: Path) -> list[Path]:
    """Delete the archives no JVM can map again: one of their files is gone or changed, or unrecorded.

    Another installation's archive (another virtualenv sharing this home) stays while its
    files do. A driver that has mapped a deleted archive keeps its mapping. Key files left
    without an archive by a killed training go too, once older than :data:`TRAINING_SECONDS`.
    """
    removed = []
    for recorded in directory.glob("cds-*.key"):
        try:
            orphaned = (not recorded.with_suffix(".jsa").exists()
                        and time.time() - recorded.stat().st_mtime > TRAINING_SECONDS)
        except OSError:
            continue  # deleted meanwhile by another pruning process
        if orphaned:
            recorded.unlink(missing_ok=True)
    for archive in directory.glob("cds-*.jsa"):
        if archive == keep:
            continue
        recorded = _key_file(archive)
        try:
            stamps = [line for line in recorded.read_text().splitlines() if "\t" in line]
        except OSError:
            stamps = []
        if stamps and all(_stamp(Path(line.split("\t", 1)[0])) == line for line in stamps):
            continue
        archive.unlink(missing_ok=True)
        recorded.unlink(missing_ok=True)
        removed.append(archive)
    return removed


def driver_archive(home: Path) -> Path:
    """:func:`archive_path` for the class path a local driver of this installation has."""
    from infra.spark import driver_class_path
    from tidemark.settings import settings

    return archive_path(home, driver_class_path(home, s3=settings().storage == "s3"))


def driver_options(archive: Path) -> str:
    """The driver's JVM options that map ``archive``, or nothing when it was never built."""
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive.is_file() else ""


def build(home: Path, *, timeout: float = TRAINING_SECONDS) -> Path | None:
    """The archive of the Spark driver's classes, training it first if missing; None if HotSpot cannot.

    The training runs in a child process (:func:`_train`), because a JVM writes its archive
    only as it exits, and a Python process has one driver JVM for life.
    """
    from infra.spark import driver_class_path
    from tidemark.settings import settings

    key = _key(driver_class_path(home, s3=settings().storage == "s3"))  # as the files are before training, which must not change them
    target = _named(home, key)
    if target.is_file():
        _prune_beside(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(".cds-*.jsa.partial"):  # a training killed before it could tidy up
        if time.time() - stale.stat().st_mtime > timeout:
            stale.unlink(missing_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".cds-", suffix=".jsa.partial", dir=target.parent)
    os.close(fd)
    os.unlink(partial)  # HotSpot writes it afresh
    try:
        try:
            done = subprocess.run([sys.executable, "-m", "infra.cds", partial], capture_output=True, text=True,
                                  timeout=timeout, check=False)
            failed = "" if done.returncode == 0 else (
                f"training exited {done.returncode}: " + " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
        except subprocess.TimeoutExpired:
            failed = f"training took more than {timeout:.0f} s"
        if not failed and (not Path(partial).is_file() or Path(partial).stat().st_size == 0):
            failed = "the JVM wrote no archive as it exited"
        if failed:
            print(f"note: no class-data sharing archive for the Spark driver (a JVM start stays a few "
                  f"seconds slower): {failed}", file=sys.stderr)
            return None
        _key_file(target).write_text("\n".join(key) + "\n")
        os.replace(partial, target)
        _prune_beside(target)
        return target
    finally:
        Path(partial).unlink(missing_ok=True)


def _prune_beside(target: Path) -> None:
    for stale in prune(target.parent, target):
        print(f"deleted a class-data sharing archive no JVM can map any more: {stale.name}", file=sys.stderr)


def _train(partial: Path) -> None:
    """The driver's ordinary work on a few rows: planning, code generation, Delta's log and files."""
    import shutil

    from pyspark import SparkContext
    from pyspark.sql import types as T

    from infra.spark import build_session, spark_conf
    from tidemark.settings import settings

    # A local driver whatever the environment says (the archive is of the driver's classes),
    # and none mapped: HotSpot 17 writes a dynamic archive only on top of the JDK's own.
    chosen = settings()
    chosen = chosen.model_copy(update={"spark": chosen.spark.model_copy(
        update={"master": "local[2]", "class_data_sharing": False})})
    warehouse = Path(tempfile.mkdtemp(prefix="tidemark-cds-"))
    options = spark_conf(chosen)["spark.driver.extraJavaOptions"]
    try:
        spark = build_session(chosen, "tidemark-cds", warehouse=warehouse, extra={
            "spark.driver.extraJavaOptions": f"{options} -XX:ArchiveClassesAtExit={partial} {_QUIET}"})
        table = str(warehouse / "t")
        rows = spark.createDataFrame(
            [(i, f'{{"order_id":"o{i}","amount":{i}.5}}'.encode(), [("tidemark.txid", b"7")]) for i in range(200)],
            "offset LONG, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
        # The parse as pipelines.transform calls it: the bytes, a JSON schema, a corrupt and a UTF-8 column.
        flagged = T.StructType([T.StructField("order_id", T.StringType()), T.StructField("amount", T.DoubleType()),
                                T.StructField("_bad", T.StringType()), T.StructField("_ok", T.BooleanType())]).json()
        parsed = rows.selectExpr(
            "offset", "tidemark_is_valid_utf8(value) AS ok",
            f"tidemark_from_json(value, '{flagged}', '_bad', '_ok') AS v",
            "named_struct('id', cast(offset AS STRING), 'size', size(headers)) AS t")
        for version in range(3):
            (parsed.write.format("delta").mode("append").option("txnAppId", "cds").option("txnVersion", version)
             .save(table))
        spark.read.format("delta").load(table).groupBy("ok").count().collect()
        spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
        spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t").load()
        spark.stop()
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:  # spark-submit exec'd the JVM: its exit is the archive's last write
            proc.stdin.close()
            proc.wait(timeout=300)
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    _train(Path(sys.argv[1]))
