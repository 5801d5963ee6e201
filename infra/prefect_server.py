"""An embedded Prefect server (API, scheduler, UI) as a local process on 127.0.0.1.

Prefect's ephemeral API is enough to run a flow, but it runs no scheduler, so served
schedules would never fire, and it has no UI. ``tidemark serve`` and the demo therefore
use a real server: the one ``PREFECT_API_URL`` names, or this one. Its state (SQLite)
lives under the stack's home, so runs stay visible across restarts.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

from infra.process import PidFile, require_free_ports, spawn, stop_process, wait_until


class EmbeddedPrefect:
    def __init__(self, root: Path, *, port: int = 14200) -> None:
        self.root = root
        self.port = port
        self.pidfile = PidFile(root / "server.pid")
        self.log = root / "server.log"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"PREFECT_HOME": str(self.root / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(self.port),
                "PREFECT_UI_API_URL": self.api_url, "PREFECT_API_URL": ""}

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.api_url + "/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def running(self) -> bool:
        return self.pidfile.process() is not None

    def start(self, timeout: float = 180) -> str:
        """Start the server unless it runs; return its API URL once it answers."""
        if self.running():
            wait_until(self.healthy, timeout=timeout, what="Prefect server", alive=self.running, log=self.log)
            return self.api_url
        require_free_ports({"Prefect server": self.port}, "TIDEMARK_PREFECT__PORT")
        self.root.mkdir(parents=True, exist_ok=True)
        pid = spawn([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                     "--port", str(self.port)], log=self.log, cwd=self.root, env=self.env())
        self.pidfile.write(pid)
        wait_until(self.healthy, timeout=timeout, what="Prefect server", alive=self.running, log=self.log)
        return self.api_url

    def stop(self) -> None:
        proc = self.pidfile.process()
        if proc is not None:
            for child in proc.children(recursive=True):
                stop_process(child, grace=15)
            stop_process(proc, grace=30)
        self.pidfile.path.unlink(missing_ok=True)

    def describe(self) -> str:
        return f"{self.ui_url} (UI), API {self.api_url}" if self.running() else "stopped"


def check_api(url: str, *, named_by: str = "PREFECT_API_URL", timeout: float = 3.0, patience: float = 20.0) -> None:
    """One line, within seconds, when the Prefect API a command is pointed at does not answer.

    A refused connection or an error answer is that line at once; a health check that times out
    is asked again for up to ``patience`` seconds first: a server busy on a loaded machine (CI's
    side-by-side stages) answered after more than 3 s and a command had stopped with exit 75."""
    from tidemark.errors import ServiceUnavailableError

    deadline = time.monotonic() + patience
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status == 200:
                    return
                problem = f"answered {resp.status}"
                break
        except OSError as exc:  # URLError, a refused connection, a timeout
            reason = getattr(exc, "reason", exc)
            problem = str(reason)
            if not isinstance(reason, TimeoutError) or time.monotonic() + timeout > deadline:
                break
    raise ServiceUnavailableError(f"the Prefect API at {url} ({named_by}) does not answer ({problem}): is the "
                                  "server up, and is that its address?")
