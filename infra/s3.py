"""An embedded S3 server (s3proxy, filesystem backend) on 127.0.0.1, for ``TIDEMARK_STORAGE=s3``.

s3proxy serves the S3 API over a local directory and answers ``If-None-Match: *`` on PUT
(412 when the key exists), the condition Tidemark's commits to S3 rely on; s3rver, for one,
ignores it. It is one self-contained jar from Maven Central (``infra/jars``, profile
``s3proxy``) and starts in about a second. Its ``filesystem-nio2`` store decides the
condition atomically with the write, as S3 does (it publishes a created key with link(2),
which fails when the key exists), where s3proxy before 4.0 checked and then wrote, so two
overlapping creates could both succeed. s3proxy 4.0 also pages a listing that names both
``continuation-token`` and ``start-after`` as S3 does (the token wins), which delta-rs sends
for a log of over 1,000 keys. Its credentials are random, made at the first
start, and kept in an AWS shared-credentials file under the stack's home (mode 0600), which
is where every client reads them (``tidemark.storage``); they appear nowhere else.
"""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from pathlib import Path

from infra import jars as jar_cache
from infra.process import PidFile, java_executable, require_free_ports, spawn, stop_process, wait_until
from tidemark.storage import read_credentials, write_credentials


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
            "jclouds.provider=filesystem-nio2",
            f"jclouds.filesystem.basedir={self.data}",
            "jclouds.region=us-east-1",
        ]) + "\n")
        pid = spawn([java_executable(), "-Xmx256m", "-jar", str(s3proxy), "--properties", str(properties)],
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
