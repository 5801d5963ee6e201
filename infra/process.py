"""Small, careful helpers for the server processes the embedded stack owns.

A server is recorded by a pid file holding its pid and start time, so a pid reused by
an unrelated process after a reboot is never mistaken for ours (and never killed).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tidemark.errors import MissingToolError, PortInUseError, ServiceStartError

LOOPBACK = "127.0.0.1"


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free_ports(ports: dict[str, int], setting: str) -> None:
    taken = {name: port for name, port in ports.items() if not port_is_free(port)}
    if taken:
        listing = ", ".join(f"{name} {port}" for name, port in taken.items())
        raise PortInUseError(
            f"port(s) in use on {LOOPBACK}: {listing}. Stop whatever holds them "
            f"(`tidemark stack down` if it is an earlier stack) or choose others with {setting}"
        )


def ephemeral_ports() -> range:
    """The kernel's range for the source ports of outgoing connections (Linux's default if it
    cannot be read). A server must not listen inside it: any client connecting anywhere may be
    handed the port between our check that it is free and the server's bind."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A free port outside the ephemeral range (for tests and throwaway servers), from a random
    start so that two callers before either binds are unlikely to be handed the same one."""
    return free_port_block(1, start=random.randrange(20000, 30000))


def free_port_block(size: int, start: int = 29092) -> int:
    """The first port ``p`` from ``start`` such that ``p .. p+size-1`` are all free and none is
    in :func:`ephemeral_ports` (whose ports outgoing connections take at any moment)."""
    ephemeral = ephemeral_ports()
    port = start
    while port + size <= 65536:
        block = range(port, port + size)
        if block.start <= ephemeral[-1] and ephemeral[0] <= block[-1]:
            port = ephemeral[-1] + 1  # the block overlaps the ephemeral range: skip past it
            continue
        if all(port_is_free(q) for q in block):
            return port
        port += size
    raise RuntimeError(f"no block of {size} free ports on {LOOPBACK} outside the ephemeral range {ephemeral}")


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise MissingToolError(
            "Java 17+ is needed for Kafka and Spark but `java` is not on PATH and JAVA_HOME "
            "is unset: install OpenJDK 17 (`apt-get install openjdk-17-jre-headless`)"
        )
    return found


class PidFile:
    """``<pid> <create_time>`` of one server process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, pid: int) -> None:
        created = psutil.Process(pid).create_time()
        self.path.write_text(f"{pid} {created}\n")

    def process(self) -> psutil.Process | None:
        """The live process this file names, or None (and the stale file is removed)."""
        try:
            pid_s, created_s = self.path.read_text().split()
            proc = psutil.Process(int(pid_s))
            if abs(proc.create_time() - float(created_s)) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
            pass
        self.path.unlink(missing_ok=True)
        return None


def spawn(cmd: list[str], *, log: Path, cwd: Path, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` detached from our session (it outlives the CLI), output to ``log``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
    return proc.pid


def stop_process(proc: psutil.Process, *, grace: float) -> None:
    """SIGTERM, wait ``grace`` seconds for a clean shutdown, then SIGKILL."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    except psutil.NoSuchProcess:
        pass


def wait_until(
    ready: Callable[[], bool], *, timeout: float, what: str, alive: Callable[[], bool], log: Path
) -> None:
    """Poll ``ready`` until true; fail fast if the process died, slow if it never answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise ServiceStartError(f"{what} exited during start-up; last lines of {log}:\n{tail(log)}")
        time.sleep(0.25)
    raise ServiceStartError(f"{what} did not become ready within {timeout:.0f}s; see {log}:\n{tail(log)}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"
