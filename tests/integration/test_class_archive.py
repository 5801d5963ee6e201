"""The driver's class archive (infra.cds): HotSpot maps Spark's classes from it, and skips a bad one silently."""

from __future__ import annotations

import subprocess
import sys
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
options = spark_conf(settings)["spark.driver.extraJavaOptions"] + " -Xlog:class+load=info:file=" + sys.argv[1]
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
    # From the dynamic (top) archive: Spark's and Scala's classes, not only the JDK's own.
    for name in ("org.apache.spark.SparkContext", "scala.collection.immutable.List",
                 "org.apache.spark.sql.catalyst.expressions.Expression"):
        assert sources.get(name) == "shared objects file (top)", f"{name}: {sources.get(name)}"
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


def test_the_archive_is_named_by_the_class_path_it_was_trained_on(tmp_path: Path) -> None:
    one = cds.archive_path(tmp_path, ("a.jar", "b.jar"))
    assert one == cds.archive_path(tmp_path, ("a.jar", "b.jar"))
    assert one != cds.archive_path(tmp_path, ("b.jar", "a.jar"))
    assert one != cds.archive_path(tmp_path, ("a.jar",))
    assert one.parent == tmp_path / "jars"
