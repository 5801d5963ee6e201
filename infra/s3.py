"""An embedded S3 server (s3proxy, filesystem backend) on 127.0.0.1, for ``TIDEMARK_STORAGE=s3``.

s3proxy serves the S3 API over a local directory and answers ``If-None-Match: *`` on PUT
(412 when the key exists), the condition Tidemark's commits to S3 rely on; s3rver, for one,
ignores it. It is one self-contained jar from Maven Central (``infra/jars``, profile
``s3proxy``) and starts in about a second. Its check of the condition is not atomic with the
write, as S3's is, so it runs under ``infra/s3server`` (compiled here, once, against that jar),
which makes a conditional create exclusive per key. Its credentials are random, made at the first
start, and kept in an AWS shared-credentials file under the stack's home (mode 0600), which
is where every client reads them (``tidemark.storage``); they appear nowhere else.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from infra import jars as jar_cache
from infra.process import PidFile, java_executable, require_free_ports, spawn, stop_process, wait_until
from tidemark.errors import MissingToolError, StackError
from tidemark.storage import read_credentials, write_credentials

SERVER_SOURCES = Path(__file__).parent / "s3server"
SERVER_MAIN = "io.tidemark.s3server.ExclusiveCreateS3Proxy"


def server_jar(home: Path, s3proxy: Path) -> Path:
    """The wrapper's jar, compiled against ``s3proxy`` once per version of both."""
    sources = sorted(SERVER_SOURCES.rglob("*.java"))
    digest = hashlib.sha256(s3proxy.name.encode())
    for source in sources:
        digest.update(source.read_bytes())
    target = home / "jars" / f"s3server-{digest.hexdigest()[:12]}" / "tidemark-s3server.jar"
    if target.exists():
        return target
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise MissingToolError("a JDK (`javac`, `jar`) is needed once to build the embedded S3 server: "
                               "install OpenJDK 17 and run `tidemark stack up` again")
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        for cmd in ([javac, "--release", "17", "-cp", str(s3proxy), "-d", str(classes), *map(str, sources)],
                    [jar, "cf", str(Path(tmp) / "out.jar"), "-C", str(classes), "."]):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise StackError(f"building the embedded S3 server failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.partial")
        shutil.copyfile(Path(tmp) / "out.jar", staged)
        staged.replace(target)
    return target


class EmbeddedS3:
    def __init__(self, root: Path, home: Path, *, port: int = 19000, bucket: str = "tidemark",
                 credentials: Path | None = None) -> None:
        self.root = root
        self.home = home
        self.port = port
        self.bucket = bucket
        self.credentials = credentials or root / "credentials"
        self.data = root / "data"
        self.pidfile = PidFile(root / "server.pid")
        self.log = root / "server.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(urllib.request.Request(self.endpoint, method="HEAD"), timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: it is up
        except OSError:
            return False

    def running(self) -> bool:
        return self.pidfile.process() is not None

    def _identity(self) -> tuple[str, str]:
        """The server's access key and secret, made once and kept in :attr:`credentials`."""
        if not self.credentials.exists():
            write_credentials(self.credentials, f"tidemark-{secrets.token_hex(4)}", secrets.token_urlsafe(24))
        return read_credentials(self.credentials, "the embedded S3 server", profile="default")

    def start(self, timeout: float = 60) -> str:
        """Start the server unless it runs, with :attr:`bucket` in it; return the endpoint once it answers."""
        if self.running():
            wait_until(self.answers, timeout=timeout, what="S3 server", alive=self.running, log=self.log)
            return self.endpoint
        require_free_ports({"S3 server": self.port}, "TIDEMARK_S3__PORT")
        s3proxy = jar_cache.resolve(self.home, "s3proxy").jars[0]
        wrapper = server_jar(self.home, s3proxy)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.data / self.bucket).mkdir(parents=True, exist_ok=True)  # a bucket is a directory of the backend
        key, secret = self._identity()
        properties = self.root / "s3proxy.properties"
        properties.touch(mode=0o600)
        properties.write_text("\n".join([
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={key}",
            f"s3proxy.credential={secret}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.data}",
            "jclouds.region=us-east-1",
        ]) + "\n")
        pid = spawn([java_executable(), "-Xmx256m", "-cp", f"{s3proxy}:{wrapper}", SERVER_MAIN, str(properties)],
                    log=self.log, cwd=self.root)
        self.pidfile.write(pid)
        wait_until(self.answers, timeout=timeout, what="S3 server", alive=self.running, log=self.log)
        return self.endpoint

    def stop(self) -> None:
        proc = self.pidfile.process()
        if proc is not None:
            stop_process(proc, grace=10)
        self.pidfile.path.unlink(missing_ok=True)

    def describe(self) -> str:
        return f"{self.endpoint}, bucket {self.bucket}, data in {self.data}" if self.running() else "stopped"
