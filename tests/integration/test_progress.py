"""Bounded ingest draws a progress bar on a terminal, and nothing when piped."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path

from tests.ingest_harness import ingest_argv, process_env, write_config
from tests.kafka_helpers import settled_lsos, transactional_producer, write_transaction


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal (120 columns) as stdout and stderr; (exit code, what it drew)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, env={**process_env(), "TERM": "xterm"}, stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(120), b"".join(chunks).decode(errors="replace")


def test_bounded_ingest_shows_progress_on_a_terminal_only(kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    topic = topic_factory("progress", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(6):
        write_transaction(producer, topic, [json.dumps({"id": t * 10 + i}).encode() for i in range(10)],
                          commit=t != 3)
    total = sum(settled_lsos(kafka_bootstrap, topic, 2).values())
    config = write_config(tmp_path / "tidemark.yaml", kafka_bootstrap, tmp_path / "orders", topics=[topic],
                          max_records_per_batch=20)

    code, drawn = _on_a_terminal(ingest_argv(config))
    assert code == 0, drawn[-3000:]
    assert f"{total:,}/{total:,} offsets" in drawn, drawn[-3000:]  # every offset to the LSO snapshot
    assert "batch(es)" in drawn and "orders: " in drawn

    # More records, and this time through a pipe: the same run, no bar.
    write_transaction(producer, topic, [json.dumps({"id": 100 + i}).encode() for i in range(5)], commit=True)
    piped = subprocess.run(ingest_argv(config), env=process_env(), capture_output=True, text=True, timeout=300,
                           check=False)
    assert piped.returncode == 0, piped.stderr
    assert "offsets" not in piped.stderr + piped.stdout and "1 batch(es), 5 rows" in piped.stdout
