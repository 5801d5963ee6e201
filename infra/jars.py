"""Resolve the pinned JVM jars from Maven Central into a local cache, once.

``infra/jars/pom.xml`` names the artifacts in profiles: ``kafka`` (the broker's
classpath), ``spark`` (the jars a Spark session loads: spark-sql-kafka, delta-spark,
delta-storage), and, only with ``TIDEMARK_STORAGE=s3``, ``s3`` (hadoop-aws and the AWS SDK
modules S3A needs) and ``s3proxy`` (the embedded S3 server), and, only when the stack runs a
schema registry, ``registry`` (Apicurio Registry's archive). Each profile is copied into
``<home>/jars/<profile>-<pom hash>/`` with a Maven repository private to Tidemark, so a changed pom re-resolves and an unchanged one
never touches the network again. Spark jars that pyspark already ships (Scala, Jackson,
Hadoop...) are left out so the session sees one copy of each library.

``python -m infra.bootstrap`` resolves the profiles the settings need (``make`` does it for you).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidemark.errors import JarsMissingError, MissingToolError

Profile = Literal["kafka", "spark", "s3", "s3proxy", "registry"]
#: Profiles whose jars join a Spark session's: pyspark's own copies of a library win.
SPARK_PROFILES = ("spark", "s3")

POM_DIR = Path(__file__).parent / "jars"
_COMPLETE = ".complete"
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+(?:\.\d+)+[\w.\-]*)\.jar$")


@dataclass(frozen=True)
class JarSet:
    """The resolved jars of one profile."""

    profile: Profile
    directory: Path

    @property
    def jars(self) -> list[Path]:
        return sorted(self.directory.glob("*.jar"))

    @property
    def classpath(self) -> str:
        return ":".join(str(j) for j in self.jars)

    def version_of(self, artifact: str) -> str:
        """Version of ``artifact`` in this set, read from its file name."""
        for jar in self.jars:
            m = _VERSIONED_JAR.match(jar.name)
            if m and m["artifact"] == artifact:
                return m["version"]
        raise JarsMissingError(f"{artifact} is not among the {self.profile} jars in {self.directory}")


def _pom_hash() -> str:
    digest = hashlib.sha256()
    for name in ("pom.xml", "settings.xml"):
        digest.update((POM_DIR / name).read_bytes())
    return digest.hexdigest()[:12]


def jar_dir(home: Path, profile: Profile) -> Path:
    return home / "jars" / f"{profile}-{_pom_hash()}"


def cached(home: Path, profile: Profile) -> JarSet:
    """The cached jars of ``profile``; raises if they were never resolved."""
    directory = jar_dir(home, profile)
    if not (directory / _COMPLETE).exists():
        raise JarsMissingError(
            f"the {profile} jars are not in the cache ({directory}); "
            "run `make bootstrap` or `python -m infra.bootstrap` once with access to Maven Central"
        )
    return JarSet(profile, directory)


def _pyspark_shipped_artifacts() -> set[str]:
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    names = set()
    for jar in shipped.glob("*.jar"):
        m = _VERSIONED_JAR.match(jar.name)
        names.add(m["artifact"] if m else jar.stem)
    return names


def resolve(home: Path, profile: Profile, *, quiet: bool = True) -> JarSet:
    """Return the jars of ``profile``, downloading them first if the cache lacks them."""
    directory = jar_dir(home, profile)
    if (directory / _COMPLETE).exists():
        return JarSet(profile, directory)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError(
            "Maven (`mvn`) is needed once to fetch the JVM jars into the cache: "
            "install it (`apt-get install maven`) and run `make bootstrap` again"
        )
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn, "-B", *(["-q"] if quiet else []),
        "-f", str(POM_DIR / "pom.xml"),
        "-s", str(POM_DIR / "settings.xml"),
        f"-Dmaven.repo.local={home / 'm2'}",
        "-P", profile,
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise JarsMissingError(
            f"Maven could not resolve the {profile} jars (exit {proc.returncode}):\n{tail}\n"
            "check access to Maven Central, then run `make bootstrap` again"
        )
    if profile in SPARK_PROFILES:
        shipped = _pyspark_shipped_artifacts()
        for jar in staging.glob("*.jar"):
            m = _VERSIONED_JAR.match(jar.name)
            if m and m["artifact"] in shipped:
                jar.unlink()
    (staging / _COMPLETE).write_text(_pom_hash())
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return JarSet(profile, directory)
