"""``python -m infra.bootstrap``: everything a fresh machine needs before Tidemark's first JVM.

``make bootstrap`` runs it after installing the Python packages: the jars the settings'
profiles need (``infra.jars``), Tidemark's own Spark classes (``infra.udfs``), then the
driver's class-data sharing archive (``infra.cds``), trained by running a driver's ordinary
work once in a child process. It sits above the modules that build a session, so that
those never import the set-up that trains on them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra import cds, jars, udfs
from infra.classpath import driver_class_path
from tidemark.settings import settings


def main() -> int:
    from tidemark.settings import settings

    home = settings().home_dir
    profiles = ("kafka", "spark", *(("s3", "s3proxy") if settings().storage == "s3" else ()))
    for profile in profiles:
        jar_set = jars.resolve(home, profile)  # type: ignore[arg-type]
        print(f"{profile}: {len(jar_set.jars)} jars in {jar_set.directory}")
    print(f"Tidemark's Spark classes: {udfs.build(home)}")
    if settings().spark.class_data_sharing:
        archive = build_archive(home)
        if archive is not None:
            print(f"the Spark driver's class-data sharing archive: {archive}")
    return 0


def build_archive(home: Path, *, timeout: float = cds.TRAINING_SECONDS) -> Path | None:
    """The archive of the Spark driver's classes, training it first if missing; None if HotSpot cannot.

    The training runs in a child process (:func:`_train`), because a JVM writes its archive
    only as it exits, and a Python process has one driver JVM for life.
    """
    key = cds.key_of(driver_class_path(home, s3=settings().storage == "s3"))  # as the files are before training, which must not change them
    target = cds.named(home, key)
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
            done = subprocess.run([sys.executable, "-m", "infra.bootstrap", "--train", partial], capture_output=True, text=True,
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
        cds.key_file(target).write_text("\n".join(key) + "\n")
        os.replace(partial, target)
        _prune_beside(target)
        return target
    finally:
        Path(partial).unlink(missing_ok=True)


def _prune_beside(target: Path) -> None:
    for stale in cds.prune(target.parent, target):
        print(f"deleted a class-data sharing archive no JVM can map any more: {stale.name}", file=sys.stderr)


def _train(partial: Path) -> None:
    """The driver's ordinary work on a few rows: planning, code generation, Delta's log and files."""
    import shutil

    from pyspark import SparkContext
    from pyspark.sql import types as T

    from infra.spark import build_session, spark_conf

    # A local driver whatever the environment says (the archive is of the driver's classes),
    # and none mapped: HotSpot 17 writes a dynamic archive only on top of the JDK's own.
    chosen = settings()
    chosen = chosen.model_copy(update={"spark": chosen.spark.model_copy(
        update={"master": "local[2]", "class_data_sharing": False})})
    warehouse = Path(tempfile.mkdtemp(prefix="tidemark-cds-"))
    options = spark_conf(chosen)["spark.driver.extraJavaOptions"]
    try:
        spark = build_session(chosen, "tidemark-cds", warehouse=warehouse, extra={
            "spark.driver.extraJavaOptions": f"{options} -XX:ArchiveClassesAtExit={partial} {cds.QUIET}"})
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
    if sys.argv[1:2] == ["--train"]:
        _train(Path(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
