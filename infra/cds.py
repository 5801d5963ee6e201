"""A class-data sharing archive for the Spark driver: a JVM start without loading its classes again.

Every ``tidemark ingest``, audit and backfill process starts a JVM that loads, parses and
verifies some 20,000 classes of Spark, Scala, Hadoop and Delta before it reads a record;
a crash-recovering deployment and the SIGKILL tests pay that at every restart. HotSpot can
map those classes, already parsed, from an archive written by an earlier run
(class-data sharing, JDK 13+), which shortens every cold start (docs/benchmarks.md,
"Class-data sharing for the driver").

How it stays safe:

1. ``make bootstrap`` (:func:`infra.bootstrap.build_archive`) runs a small training workload in a child process
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
import time
from pathlib import Path

from infra.process import java_executable

#: Turns HotSpot's CDS messages off: a mismatched archive is skipped, not worth a line.
QUIET = "-Xlog:cds*=off"


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


def key_of(class_path: tuple[str, ...]) -> list[str]:
    import pyspark

    settings = [f"{name}={os.environ.get(name, '')}" for name in _CLASS_PATH_ENVIRONMENT]
    return [f"pyspark {pyspark.__version__}", *settings, *(_stamp(f) for f in _checked_files(class_path))]


def archive_path(home: Path, class_path: tuple[str, ...]) -> Path:
    """Where the archive for this JVM and this driver class path, as its files are now, lives (absent until built)."""
    return named(home, key_of(class_path))


def named(home: Path, key: list[str]) -> Path:
    return home / "jars" / f"cds-{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:12]}.jsa"


def key_file(archive: Path) -> Path:
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
        recorded = key_file(archive)
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
    from infra.classpath import driver_class_path
    from tidemark.settings import settings

    return archive_path(home, driver_class_path(home, s3=settings().storage == "s3"))


def driver_options(archive: Path) -> str:
    """The driver's JVM options that map ``archive``, or nothing when it was never built."""
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""
