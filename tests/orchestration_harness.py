"""Running Tidemark's Prefect flows as real processes against a real Prefect server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FLOW_SCRIPT = """
import json, sys
from orchestration import flows
state = getattr(flows, sys.argv[1])(**json.loads(sys.argv[2]), return_state=True)
result = state.result(raise_on_failure=False)
print("FLOWRUN " + json.dumps({"id": str(state.state_details.flow_run_id), "type": state.type.value,
                               "result": result if state.is_completed() else repr(result)}, default=str),
      flush=True)
"""


def prefect_env(api_url: str, home: Path) -> dict[str, str]:
    """The environment of a process that talks to the test's Prefect server."""
    return {**{k: v for k, v in os.environ.items() if k != "TIDEMARK_CRASH_AT"},
            "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "INFO"}


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Until ``log`` holds ``text``, failing if ``proc`` (writing it) exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"process exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def start_flow(flow: str, kwargs: dict[str, Any], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-c", FLOW_SCRIPT, flow, json.dumps(kwargs)], env=env,
                            stdout=out, stderr=subprocess.STDOUT)


def flow_outcome(log: Path) -> dict[str, Any]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("FLOWRUN "):
            return dict(json.loads(line[len("FLOWRUN "):]))
    raise AssertionError(f"the flow process printed no outcome:\n{log.read_text(errors='replace')[-3000:]}")


def task_run_counts(api_url: str, flow_run_id: str) -> list[int]:
    """How many times each task of the flow run ran (1 = no retry), read from the server."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # sort and limit explicit: this server rejects the client's nulls for them.
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                     sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=100)
        return [r.run_count for r in runs]


@contextmanager
def delayed_proxy(target: tuple[str, int]) -> Iterator[tuple[int, threading.Event]]:
    """A TCP port that refuses connections until the event is set, then forwards to ``target``.

    Kafka clients only bootstrap through it: the broker's metadata sends them straight to
    the broker's own address afterwards.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    open_now = threading.Event()
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        open_now.wait()
        if stop.is_set():
            return
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen()
            listener.settimeout(0.5)
            while not stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection(target)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, open_now
    finally:
        stop.set()
        open_now.set()
        thread.join(5)
