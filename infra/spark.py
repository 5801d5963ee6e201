"""The one place a SparkSession is built: Delta and the Kafka source from the jar cache.

Jars come from the local cache (``infra.jars``) through ``spark.jars``, never through
``spark.jars.packages``, so a session never triggers an Ivy download and works offline.
Settings are sane for a 2-core laptop and for tests: loopback binding (Spark otherwise
picks a non-loopback address), few shuffle partitions, no UI.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from infra import cds, udfs
from infra import jars as jar_cache
from infra.classpath import driver_class_path
from tidemark.errors import StackError
from tidemark.logs import ROTATE_BYTES, ROTATE_KEEP, SPARK_LOG, jvm_output_to_log
from tidemark.settings import Settings

log = logging.getLogger(__name__)

LOG4J2 = Path(__file__).parent / "spark-log4j2.properties"
LOG_STORE = "io.tidemark.delta.LocalListingLogStore"

#: Tidemark's own columns whose values are (nearly) all distinct in a file, written without
#: Parquet's dictionary, which never pays on them; readers see ordinary Parquet
#: (docs/benchmarks.md, "Plainly encoded id columns").
PLAIN_ENCODED_COLUMNS = ("_tidemark_event_id", "_tidemark_txn.id")

#: HotSpot compiles a method once it has run this many times more than its defaults say: the
#: driver's planning code stops costing C2 time every batch, while the data path's loops still
#: reach C2 (docs/benchmarks.md, "JIT thresholds").
JIT_OPTIONS = "-XX:CompileThresholdScaling=5"

#: Spark's ``spark.sql.sources.useV1SourceList`` without ``kafka``: a batch's Kafka ranges
#: (``pipelines.transform.read_ranges``) are read through the source's DataSource V2 scan, which
#: writes Spark's row once where V1 converts each record to a ``Row`` and back; both read the
#: same records (docs/benchmarks.md, "Kafka reads through DataSource V2").
V1_SOURCES = "avro,csv,json,orc,parquet,text"

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_conf(settings: Settings, *, warehouse: Path | None = None) -> dict[str, str]:
    """Every Spark setting Tidemark relies on, as a plain dict (also used by spark-submit docs)."""
    home = settings.home_dir
    s3 = settings.storage == "s3"
    class_path = driver_class_path(home, s3=s3)
    conf = {
        "spark.master": settings.spark.master,
        "spark.jars": ",".join(class_path[1:]),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.driver.memory": settings.spark.driver_memory,
        "spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions),
        "spark.default.parallelism": str(max(2, os.cpu_count() or 2)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.warehouse.dir": str(warehouse or home / "spark-warehouse"),
        "spark.jars.ivy": str(home / "ivy"),
        "spark.databricks.delta.snapshotPartitions": "2",
        # _delta_log listed from the newest checkpoint, not whole: by name on local paths
        # (infra/java), by S3A's start-after on s3a:// (Delta's own switch).
        "spark.delta.logStore.file.impl": LOG_STORE,
        "spark.hadoop.delta.enableFastS3AListFrom": "true",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.sources.useV1SourceList": V1_SOURCES,
        # PySpark 4 otherwise records the Python call site of every Column method and
        # `functions.col` call in the JVM (py4j round trips; docs/benchmarks.md, "Python call
        # sites not recorded"). PySpark reads the setting once per process.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        **{f"spark.hadoop.parquet.enable.dictionary#{column}": "false" for column in PLAIN_ENCODED_COLUMNS},
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={home / 'derby'} -Dlog4j2.configurationFile={_log4j2()} {JIT_OPTIONS} "
            f"{cds.driver_options(cds.archive_path(home, class_path)) if settings.spark.class_data_sharing else ''}"
        ).strip(),
    }
    if s3:
        from tidemark.storage import s3_access

        conf.update(s3_access(settings, strict=False).spark_conf())
    if settings.spark.master.startswith("local"):
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
        # Local paths without a process per chmod and per link check (io.tidemark.fs): Hadoop
        # loads its file system before `spark.jars`, so from the JVM's own class path, which in
        # local mode is the executors' too.
        conf["spark.driver.extraClassPath"] = str(udfs.fs_jar_path(home))
        conf["spark.hadoop.fs.file.impl"] = "io.tidemark.fs.NioLocalFileSystem"
        conf["spark.hadoop.fs.AbstractFileSystem.file.impl"] = "io.tidemark.fs.NioLocalFs"
    return conf


def _log4j2(rotate_bytes: int = ROTATE_BYTES) -> Path:
    """The driver's log4j2 configuration: stderr (as shipped), or a file when the CLI says so (``tidemark.logs``).

    The file, ``spark.log``, rolls over as ``tidemark.log`` does (at ``rotate_bytes``, keeping
    :data:`~tidemark.logs.ROTATE_KEEP`, ``spark.log.1`` the newest): a follower's or serve's
    driver writes to it for months.
    """
    directory = os.environ.get("TIDEMARK_LOG_DIR")
    if not directory or os.environ.get("TIDEMARK_VERBOSE"):
        return LOG4J2
    path = Path(directory) / "spark-log4j2.properties"
    log = Path(directory) / SPARK_LOG
    shipped = [line for line in LOG4J2.read_text().splitlines()
               if line not in ("appender.console.type = Console", "appender.console.target = SYSTEM_ERR")]
    to_file = [line.replace("%d{HH:mm:ss}", "%d{yyyy-MM-dd HH:mm:ss}") for line in shipped] + [
        "appender.console.type = RollingFile",
        f"appender.console.fileName = {log}",
        f"appender.console.filePattern = {log}.%i",
        "appender.console.policies.type = Policies",
        "appender.console.policies.size.type = SizeBasedTriggeringPolicy",
        f"appender.console.policies.size.size = {rotate_bytes}",
        "appender.console.strategy.type = DefaultRolloverStrategy",
        f"appender.console.strategy.max = {ROTATE_KEEP}",
        "appender.console.strategy.fileIndex = min"]
    path.write_text("# Written by Tidemark from infra/spark-log4j2.properties: the driver's log to a file.\n"
                    + "\n".join(to_file) + "\n")
    return path


def build_session(settings: Settings, app_name: str = "tidemark", *, warehouse: Path | None = None,
                  without: tuple[str, ...] = (), extra: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession with Delta Lake and the Kafka source ready to use.

    ``without`` leaves those of Tidemark's settings out (benchmarks measuring what one buys);
    ``extra`` adds or overrides settings (the warm driver's fair scheduling).
    """
    from pyspark.sql import SparkSession

    if settings.spark.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**spark_conf(settings, warehouse=warehouse), **(extra or {})}.items():
        if key not in without:
            builder = builder.config(key, value)
    with jvm_output_to_log() as log:  # the driver JVM starts here and keeps this stdout and stderr
        try:
            session = builder.getOrCreate()
        except Exception as exc:
            if log is None or "JAVA_GATEWAY_EXITED" not in str(exc):
                raise
            tail = " | ".join(line.strip() for line in log.read_text(errors="replace").splitlines()[-3:])
            raise StackError(f"the Spark driver's JVM exited as it started: {tail or 'no output'} "
                             f"(its output is in {log})") from None
    session.sparkContext.setLogLevel("WARN")
    _ignore_stop_signals(session)
    udfs.register(session)
    return session


def _ignore_stop_signals(session: SparkSession) -> None:
    """Make the driver JVM ignore SIGTERM (PySpark's launch already makes it ignore SIGINT).

    A service manager stops a service by signalling every process of it (systemd's
    ``KillMode=control-group``), and ``timeout`` and a terminal signal the whole process
    group: the JVM would die at once, under the batch in flight, and the Python side would
    fail on a closed connection. Ignoring the signal leaves the stop to Tidemark's own
    handler (:func:`tidemark.signals.stop_on_signals`): the batch in flight finishes, then
    the session stops and its JVM with it. SIGKILL still ends it at any instant, which the
    commit protocol recovers from.
    """
    jvm = session.sparkContext._jvm
    if jvm is None:
        return
    try:
        signal_class = jvm.sun.misc.Signal
        ignore = jvm.sun.misc.SignalHandler.SIG_IGN
        signal_class.handle(signal_class("TERM"), ignore)
    except Exception as exc:  # noqa: BLE001 - a JVM without sun.misc.Signal: a group's SIGTERM ends it
        log.warning("the Spark driver's JVM does not let SIGTERM be ignored (%s); a signal to the whole process "
                    "group stops it under the batch in flight, which the next run recovers", exc)


def reachable_heap(spark: SparkSession) -> int:
    """Bytes of the driver's heap still in use after a full collection (G1's ``System.gc``).

    What a read leaves for later (a pooled Kafka consumer's last fetch) is what survives a
    collection; the heap's plain figure also counts garbage that is only waiting for one.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a classic (py4j) session"
    jvm.java.lang.System.gc()
    return int(jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed())


def versions(settings: Settings) -> dict[str, str]:
    """Spark and Delta versions this installation runs, without starting a JVM."""
    from importlib.metadata import version

    spark_jars = jar_cache.cached(settings.home_dir, "spark")
    return {
        "pyspark": version("pyspark"),
        "delta-spark (python)": version("delta-spark"),
        "delta-spark (jar)": spark_jars.version_of("delta-spark_4.1_2.13"),
        "spark-sql-kafka (jar)": spark_jars.version_of("spark-sql-kafka-0-10_2.13"),
    }
