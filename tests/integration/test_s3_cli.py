"""An S3 endpoint nobody answers at: one clear line within 10 s, at the start of the commands
that touch a pipeline's tables, instead of S3A's minutes of retries and a Java stack trace."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.process import free_port
from tests.ingest_harness import write_config


@pytest.mark.parametrize("command", [["ingest", "orders"], ["maintain", "orders"], ["check", "orders"], ["status"]])
def test_a_stopped_s3_endpoint_is_one_line_naming_it_within_10_s(tmp_path: Path, command: list[str]) -> None:
    port = free_port()  # nothing listens there
    config = write_config(tmp_path / "tidemark.yaml", "127.0.0.1:1", "s3a://tables/orders", topics=["orders"])
    env = {**os.environ, "TIDEMARK_STORAGE": "s3", "TIDEMARK_S3__ENDPOINT": f"http://127.0.0.1:{port}",
           "TIDEMARK_HOME": str(tmp_path / "home")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tidemark.cli", *command, "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    elapsed = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 75, done.stderr  # transient: a server that may come back
    assert len(lines) == 1 and f"http://127.0.0.1:{port}" in lines[0] and "TIDEMARK_S3__ENDPOINT" in lines[0], lines
    assert elapsed < 10, elapsed


def test_a_table_on_s3_without_s3_storage_is_refused_naming_the_setting(tmp_path: Path) -> None:
    config = write_config(tmp_path / "tidemark.yaml", "127.0.0.1:1", "s3a://tables/orders", topics=["orders"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_S")} | {
        "TIDEMARK_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "tidemark.cli", "ingest", "orders", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 78, done.stderr
    assert "TIDEMARK_STORAGE=s3" in done.stderr and "s3a://tables/orders" in done.stderr
