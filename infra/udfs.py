"""Tidemark's own JVM classes for Spark, compiled once from ``infra/java`` into the jar cache.

Only where Spark's or Delta's built-in is measurably slow on a hot path: UTF-8
validation of every record (``tidemark_is_valid_utf8``, same answers as Spark's
``is_valid_utf8``, several times faster on mostly-ASCII values; measured
on 2 cores), G3's column (``tidemark_txn_headers``: a record's transaction headers
in one pass over its headers, and the relay's compact per-topic counts read directly,
anything else left to ``from_json``), the parse of every JSON value (``tidemark_from_json``: an ordinary
object read in one pass over its bytes, anything else by from_json's own parser reading the
bytes with Jackson's byte parser instead of through a per-record ``InputStreamReader``;
from_json's answers except on keys built to defeat Jackson's name tables, see the class), a batch's own constants kept out of the
generated code (``tidemark_batch_constant``: one compiled write stage for every batch of a
long-lived session instead of one per batch), and Delta's log store for local paths
(``io.tidemark.delta.LocalListingLogStore``: lists ``_delta_log`` by name before asking
for the status of the few it returns: 0.03 s instead of 0.45 s a snapshot update at
10,000 commits; see docs/design.md, "Months of history"), and Hadoop's local file system
without a process per ``chmod`` and per link check (``io.tidemark.fs``, in a jar of its
own on the JVM's class path: Hadoop loads it before ``spark.jars``). One more stands where
Spark has nothing Maven Central serves: ``tidemark_from_protobuf``, ``format: protobuf``'s
decode (``pipelines.protobuf``). The jar is keyed by a hash of the sources, built with the
JDK's ``javac`` and ``jar`` against pyspark's, delta-storage's and protobuf-java's jars, so
it needs no network once the jars are cached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from infra import jars as jar_cache
from tidemark.errors import MissingToolError, StackError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SOURCES = Path(__file__).parent / "java"

#: SQL name -> Java class, registered in every session infra.spark builds.
FUNCTIONS = {"tidemark_is_valid_utf8": ("io.tidemark.spark.ValidUtf8", "boolean")}


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def jar_path(home: Path) -> Path:
    digest = hashlib.sha256()
    for source in _sources():
        digest.update(source.relative_to(SOURCES).as_posix().encode())
        digest.update(source.read_bytes())
    return home / "jars" / f"udf-{digest.hexdigest()[:12]}" / "tidemark-udf.jar"


#: Classes Hadoop itself loads (``fs.file.impl``), packed alone as well: they need Hadoop only.
FS_PACKAGE = "io/tidemark/fs"


def fs_jar_path(home: Path) -> Path:
    """The jar of :data:`FS_PACKAGE`'s classes, beside the full one (built with it)."""
    return jar_path(home).with_name("tidemark-fs.jar")


def build(home: Path) -> Path:
    """The classes' jar, compiling it first if the cache lacks this version of the sources
    (with :func:`fs_jar_path` beside it)."""
    target = jar_path(home)
    if target.exists() and fs_jar_path(home).exists():
        return target
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise MissingToolError("a JDK (`javac`, `jar`) is needed once to build Tidemark's Spark classes: "
                               "install OpenJDK 17 and run `make bootstrap` again")
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    from_cache = [j for j in jar_cache.cached(home, "spark").jars
                  if j.name.startswith(("delta-storage-", "protobuf-java-"))]
    compile_against = ("spark-sql-api_*.jar", "spark-sql_2*.jar", "spark-catalyst_*.jar", "spark-unsafe_*.jar",
                       "spark-common-utils_*.jar", "scala-library-*.jar", "jackson-core-*.jar", "kryo-shaded-*.jar",
                       "hadoop-client-api-*.jar", "slf4j-api-*.jar", "avro-1.*.jar")
    classpath = ":".join(str(j) for j in [*(j for pattern in compile_against for j in shipped.glob(pattern)),
                                          *from_cache])
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        steps = [[javac, "--release", "17", "-cp", classpath, "-d", str(classes), *map(str, _sources())],
                 [jar, "cf", str(Path(tmp) / "out.jar"), "-C", str(classes), "."],
                 [jar, "cf", str(Path(tmp) / "fs.jar"), "-C", str(classes), FS_PACKAGE]]
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise StackError(f"building Tidemark's Spark classes failed ({Path(cmd[0]).name}):\n"
                                 f"{(proc.stdout + proc.stderr).strip()[-2000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        # The full jar last: its presence says both are there. Each atomic: a concurrent session never sees half a jar.
        for built, final in ((Path(tmp) / "fs.jar", fs_jar_path(home)), (Path(tmp) / "out.jar", target)):
            staged = final.with_name(f".{final.name}.{os.getpid()}")
            shutil.copyfile(built, staged)
            os.replace(staged, final)
    return target


def register(spark: SparkSession) -> None:
    for name, (cls, returns) in FUNCTIONS.items():
        spark.udf.registerJavaFunction(name, cls, returns)  # type: ignore[arg-type]
    # A Catalyst expression, not a UDF: it returns Spark's own rows, as from_json does.
    spark._jvm.io.tidemark.spark.JsonFromBytes.register(spark._jsparkSession)  # type: ignore[union-attr]
    spark._jvm.io.tidemark.spark.BatchConstant.register(spark._jsparkSession)  # type: ignore[union-attr]
    spark._jvm.io.tidemark.spark.TxnHeaders.register(spark._jsparkSession)  # type: ignore[union-attr]
    spark._jvm.io.tidemark.spark.ProtobufFromBytes.register(spark._jsparkSession)  # type: ignore[union-attr]
    spark._jvm.io.tidemark.spark.AvroFromBytes.register(spark._jsparkSession)  # type: ignore[union-attr]
