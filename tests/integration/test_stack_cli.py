"""`tidemark stack up | status | down` and `tidemark demo` as a user runs them, in fresh homes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.stack_fixtures import free_port_block
from tidemark.settings import Settings


def _processes_under(home: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            # The Prefect server names no path on its command line; it runs in its state directory.
            if any(str(home) in part for part in proc.info["cmdline"] or []) or str(home) in (proc.info["cwd"] or ""):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _wait_gone(home: Path, timeout: float = 20) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := _processes_under(home)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture
def cli_env(tmp_path: Path, settings: Settings) -> dict[str, str]:
    """A fresh home that shares only the jar cache, and ports nobody uses."""
    home = tmp_path / "home"
    (home / "jars").mkdir(parents=True)
    for cached in (settings.home_dir / "jars").iterdir():
        (home / "jars" / cached.name).symlink_to(cached)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env.update({
        "TIDEMARK_HOME": str(home),
        "TIDEMARK_KAFKA__PORT": str(free_port_block(2, start=21092)),
        "TIDEMARK_POSTGRES__PORT": str(free_port_block(1, start=22432)),
        "TIDEMARK_PREFECT__PORT": str(free_port_block(1, start=24200)),
    })
    return env


def tidemark(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_stack_up_status_down(cli_env: dict[str, str]) -> None:
    home = Path(cli_env["TIDEMARK_HOME"])
    try:
        up = tidemark(cli_env, "stack", "up")
        assert up.returncode == 0, up.stderr
        assert f"127.0.0.1:{cli_env['TIDEMARK_KAFKA__PORT']}" in up.stdout

        again = tidemark(cli_env, "stack", "up")  # idempotent
        assert again.returncode == 0, again.stderr

        status = tidemark(cli_env, "stack", "status")
        assert status.returncode == 0, status.stderr
        lines = {line.split("  ")[0]: line for line in status.stdout.splitlines()}
        assert "4.3.1" in lines["Kafka (embedded KRaft)"] and "running" in lines["Kafka (embedded KRaft)"]
        assert "18." in lines["PostgreSQL (embedded)"] and "running" in lines["PostgreSQL (embedded)"]
        assert "4.1.3" in lines["Spark"]
        assert "4.4.0" in lines["Delta Lake"]
        assert _processes_under(home), "stack up left no server running"
    finally:
        down = tidemark(cli_env, "stack", "down")
    assert down.returncode == 0, down.stderr
    assert _wait_gone(home) == []
    after = tidemark(cli_env, "stack", "status")
    assert "stopped" in after.stdout and "(not reachable)" in after.stdout


def test_stack_up_names_a_taken_port(cli_env: dict[str, str]) -> None:
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", int(cli_env["TIDEMARK_KAFKA__PORT"])))
    holder.listen()
    try:
        result = tidemark(cli_env, "stack", "up")
    finally:
        holder.close()
        tidemark(cli_env, "stack", "down")
    assert result.returncode != 0
    assert f"kafka node 1 client {cli_env['TIDEMARK_KAFKA__PORT']}" in result.stderr
    assert "TIDEMARK_KAFKA__PORT" in result.stderr
    assert "Traceback" not in result.stderr
    assert _wait_gone(Path(cli_env["TIDEMARK_HOME"])) == []


#: Lines an operator should never see from a run that went well: a Java or Python stack
#: trace, the JVM launcher's own warnings (``WARNING: Using incubator modules``), a tqdm
#: progress bar, a librdkafka log line.
_NOISE = re.compile(r"^(\s+at [\w.$<>]+\(|Caused by: |Traceback |\S+\.\w*(Exception|Error): |WARNING: )"
                    r"|it/s\]|Calculating Metrics|^%\d\|\d+\.\d+\|", re.MULTILINE)


def test_demo_passes_and_leaves_no_process(cli_env: dict[str, str]) -> None:
    result = tidemark(cli_env, "demo", "--duration", "20", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    noise = [m.group(0) for m in _NOISE.finditer(result.stdout + result.stderr)]
    assert noise == [], f"{noise[:5]}\n{result.stderr[-3000:]}"
    logs = Path(cli_env["TIDEMARK_HOME"]) / "logs"
    assert f"in {logs / 'tidemark.log'}" in result.stderr  # where the rest went, named once
    assert result.stderr.count("other components' messages are in") == 1
    assert (logs / "spark.log").exists()
    assert "StatusLogger" not in result.stderr  # log4j read the driver's configuration without a complaint
    assert "kafka.group.id" not in (logs / "spark.log").read_text(errors="replace")  # dropped on purpose
    verdicts = [line.split()[0] for line in result.stdout.splitlines() if line.startswith(("  PASS  ", "  FAIL  "))]
    assert verdicts == ["PASS"] * 9, result.stdout
    assert "exactly-once held" in result.stdout and "Data Docs: file://" in result.stdout
    assert "the Delta table holds exactly the committed events" in result.stdout
    assert _wait_gone(Path(cli_env["TIDEMARK_HOME"])) == []


@pytest.mark.slow
def test_the_demo_through_the_schema_registry_passes_and_leaves_no_process(cli_env: dict[str, str]) -> None:
    """``tidemark demo --format avro``: the relay serializes through each topic's subject, the one
    pipeline over three topics reads them into its own; the same checks, and every value framed."""
    env = {**cli_env, "TIDEMARK_REGISTRY__PORT": str(free_port_block(2, start=23081))}
    result = tidemark(env, "demo", "--format", "avro", "--duration", "10", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = [line.split()[0] for line in result.stdout.splitlines() if line.startswith(("  PASS  ", "  FAIL  "))]
    assert verdicts == ["PASS"] * 10, result.stdout
    assert "every value in Kafka is avro by a registered schema" in result.stdout
    assert "Traceback" not in result.stderr
    assert _wait_gone(Path(cli_env["TIDEMARK_HOME"])) == []
