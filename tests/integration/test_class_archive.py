"""The driver's class archive (infra.cds): HotSpot maps Spark's classes from it, and skips a bad one silently."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import cds
from infra.process import java_executable

#: A child process: a session built as Tidemark builds one, whose JVM also logs where each class came from.
_PROBE = """
import sys
from infra.spark import build_session, spark_conf
from tidemark.settings import load_settings
settings = load_settings()
options = (spark_conf(settings)["spark.driver.extraJavaOptions"] + " -Xlog:class+load=info:file=" + sys.argv[1]
           + " -Xlog:cds=info:file=" + sys.argv[1] + ".cds")
spark = build_session(settings, "cds-probe", extra={"spark.driver.extraJavaOptions": options})
spark.range(3).selectExpr("sum(id)").collect()
spark.stop()
"""


def test_the_driver_maps_sparks_classes_from_the_archive_bootstrap_trained(tmp_path: Path) -> None:
    _trained()
    log = tmp_path / "classes.log"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(log)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    sources = {}
    for line in log.read_text().splitlines():
        if " source: " in line:
            name, source = line.split("] ", 1)[-1].split(" source: ", 1)
            sources[name.strip()] = source
    # HotSpot's reason when it refused the archive (its CDS log, silenced in production).
    refusal = [line for line in Path(f"{log}.cds").read_text().splitlines() if "UseSharedSpaces" in line]
    # From the dynamic (top) archive: Spark's and Scala's classes, not only the JDK's own.
    for name in ("org.apache.spark.SparkContext", "scala.collection.immutable.List",
                 "org.apache.spark.sql.catalyst.expressions.Expression"):
        assert sources.get(name) == "shared objects file (top)", f"{name}: {sources.get(name)}; {refusal}"
    shared = sum(1 for s in sources.values() if s.startswith("shared objects file"))
    assert shared > len(sources) // 2, f"only {shared} of {len(sources)} classes from archives"


def _trained() -> Path:
    from tidemark.settings import load_settings

    archive = cds.driver_archive(load_settings().home_dir)
    assert archive.is_file(), f"`make bootstrap` trained no archive at {archive}"
    return archive


@pytest.mark.parametrize("kind", ["empty", "garbage", "trained for another class path"])
def test_an_archive_that_does_not_fit_is_skipped_without_a_word(tmp_path: Path, kind: str) -> None:
    """What infra.cds relies on when an archive does not fit the JVM: HotSpot starts without it, silently.

    (Without the option's log setting, HotSpot warns about the last of these.)
    """
    if kind == "trained for another class path":
        archive = _trained()
    else:
        archive = tmp_path / "bad.jsa"
        archive.write_bytes(b"" if kind == "empty" else b"not an archive" * 1000)
    other = tmp_path / "other.jar"
    other.write_bytes(b"")
    options = cds.driver_options(archive).split()
    done = subprocess.run([java_executable(), *options, "-cp", str(other), "-version"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "cds" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    assert "version" in done.stderr


def test_no_archive_no_option(tmp_path: Path) -> None:
    assert cds.driver_options(tmp_path / "missing.jsa") == ""


def test_the_archive_is_named_by_the_files_hotspot_checks_it_against(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jar", tmp_path / "b.jar"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    one = cds.archive_path(tmp_path, (str(a), str(b)))
    assert one == cds.archive_path(tmp_path, (str(a), str(b)))
    assert one != cds.archive_path(tmp_path, (str(b), str(a)))
    assert one != cds.archive_path(tmp_path, (str(a),))
    assert one.parent == tmp_path / "jars"
    # HotSpot refuses an archive when a jar's time or size differs from training: a reinstalled
    # virtualenv (same paths, new times) must name another archive, not find the old one.
    trained_at = a.stat().st_mtime_ns
    os.utime(a, ns=(trained_at + 10**9, trained_at + 10**9))
    assert cds.archive_path(tmp_path, (str(a), str(b))) != one
    os.utime(a, ns=(trained_at, trained_at))
    assert cds.archive_path(tmp_path, (str(a), str(b))) == one
    a.write_bytes(b"aa")
    os.utime(a, ns=(trained_at, trained_at))
    assert cds.archive_path(tmp_path, (str(a), str(b))) != one


def test_prune_deletes_only_archives_no_jvm_can_map_again(tmp_path: Path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    files = {name: tmp_path / f"{name}.jar" for name in ("changed", "kept", "new")}
    archives = {}
    for name, jar in files.items():
        jar.write_bytes(name.encode())
        key = cds.key_of((str(jar),))
        archives[name] = cds.named(tmp_path, key)
        archives[name].write_bytes(b"archive")
        cds.key_file(archives[name]).write_text("\n".join(key) + "\n")
    unrecorded = jars / "cds-000000000000.jsa"  # named as an archive that records no files
    unrecorded.write_bytes(b"archive")
    os.utime(files["changed"], ns=(1, 1))
    # Key files without an archive: a training killed before its rename, and one still training.
    killed, training = jars / "cds-111111111111.key", jars / "cds-222222222222.key"
    for orphan in (killed, training):
        orphan.write_text(f"{files['kept']}\tstamp\n")
    long_ago = time.time() - cds.TRAINING_SECONDS - 60
    os.utime(killed, (long_ago, long_ago))

    removed = cds.prune(jars, archives["new"])

    assert sorted(removed) == sorted([archives["changed"], unrecorded])
    assert sorted(jars.iterdir()) == sorted([archives["kept"], cds.key_file(archives["kept"]),
                                             archives["new"], cds.key_file(archives["new"]), training])
