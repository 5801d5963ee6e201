"""Commits to ``s3a://`` tables stay exclusive across processes, on a real S3 server (s3proxy).

* Two Spark driver processes race ``LogStore.write`` over the same log versions, meeting at a
  barrier before each. With Delta's default ``S3SingleDriverLogStore`` both believe they won
  some versions (its check-then-write excludes only its own JVM): the harness sees it. With
  Tidemark's store every version has exactly one winner, and the stored bytes are that winner's.
* Two driver processes append to one table concurrently through Delta: no commit is lost.
* A PUT whose reply is lost after the server stored the object is not committed twice and
  not reported as a conflict.
* A session whose store is not exclusive is refused before it commits.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET, on_disk
from tidemark.storage import S3_LOG_STORE

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("needs_s3"), pytest.mark.timeout(600)]

DEFAULT_STORE = "io.delta.storage.S3SingleDriverLogStore"


def _race(tmp_path: Path, store: str, versions: int) -> tuple[list[dict[str, object]], list[dict[str, object]], Path]:
    log_dir = f"s3a://{S3_BUCKET}/race-{uuid.uuid4().hex[:8]}/_delta_log"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = []
    for writer, other in (("a", "b"), ("b", "a")):
        out = tmp_path / f"{writer}.json"
        log = (tmp_path / f"{writer}.log").open("w")
        procs.append((subprocess.Popen([sys.executable, "-m", "tests.s3_child", "race", log_dir, writer, other, str(versions),
                                        str(barrier), store, str(out)], stdout=log, stderr=subprocess.STDOUT), out,
                      tmp_path / f"{writer}.log"))
    for proc, _, log_path in procs:
        assert proc.wait(480) == 0, log_path.read_text()[-3000:]
    a, b = (json.loads(out.read_text()) for _, out, _ in procs)
    return a, b, on_disk(log_dir)


def _double_winners(a: list[dict[str, object]], b: list[dict[str, object]], stored: Path) -> tuple[int, int]:
    """(versions both writers believe they committed, versions whose stored bytes are not their only winner's)."""
    both = wrong = 0
    for ra, rb in zip(a, b, strict=True):
        version = int(ra["version"])  # type: ignore[call-overload]
        holder = json.loads((stored / f"{version:020d}.json").read_text())["commitInfo"]["writer"]
        winners = [w for w, r in (("a", ra), ("b", rb)) if r["won"]]
        both += len(winners) == 2
        wrong += winners != [holder]
    return both, wrong


def test_delta_default_store_lets_two_drivers_win_one_version(tmp_path: Path) -> None:
    """What the race catches: Delta's default S3 store, two JVMs, double winners."""
    a, b, stored = _race(tmp_path, DEFAULT_STORE, 60)
    both, wrong = _double_winners(a, b, stored)
    print(f"\nS3SingleDriverLogStore: {both} of 60 versions won by both drivers")
    assert both > 0 and wrong >= both


def test_tidemark_store_gives_every_version_exactly_one_winner(tmp_path: Path) -> None:
    a, b, stored = _race(tmp_path, S3_LOG_STORE, 150)
    both, wrong = _double_winners(a, b, stored)
    assert (both, wrong) == (0, 0)
    assert sum(bool(r["won"]) for r in a) > 0 and sum(bool(r["won"]) for r in b) > 0  # a real race: both won some


def _child(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    import os

    return subprocess.Popen([sys.executable, "-m", "tests.s3_child", *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def _commit_files(table: str) -> dict[int, list[dict[str, object]]]:
    """Every commit file of the table's log, as the server stores it: version -> its actions."""
    log = on_disk(table) / "_delta_log"
    return {int(f.stem): [json.loads(line) for line in f.read_text().splitlines()]
            for f in log.glob("*.json") if f.stem.isdigit()}


def _rows(table: str) -> list[tuple[str, int]]:
    from deltalake import DeltaTable

    from tidemark.storage import delta_rs_options

    data = DeltaTable(table, storage_options=delta_rs_options(table)).to_pyarrow_table().to_pylist()
    return sorted((r["writer"], r["seq"]) for r in data)


def test_two_drivers_appending_to_one_table_lose_no_commit(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from tidemark.storage import delta_rs_options

    table = f"s3a://{S3_BUCKET}/appends-{uuid.uuid4().hex[:8]}"
    commits = 12
    # Version 0 made first: two drivers creating one table is a protocol conflict Delta reports as such.
    write_deltalake(table, pa.table({"writer": pa.array([], pa.string()), "seq": pa.array([], pa.int32())}),
                    storage_options=delta_rs_options(table))
    procs = [(_child(["append", table, w, str(commits), str(tmp_path / f"{w}.json")], tmp_path / f"{w}.log"), w)
             for w in ("a", "b")]
    for proc, w in procs:
        assert proc.wait(480) == 0, (tmp_path / f"{w}.log").read_text()[-3000:]
    assert _rows(table) == sorted((w, i) for w in ("a", "b") for i in range(commits))
    files = _commit_files(table)
    assert sorted(files) == list(range(2 * commits + 1))  # one version per append, none lost or doubled
    assert all(any("add" in a for a in files[v]) for v in range(1, 2 * commits + 1))


def test_vacuum_keeps_the_log_and_deletes_only_untracked_data(tmp_path: Path) -> None:
    """VACUUM walks the table through the log store's listing: the log's files are never its to delete."""
    table = f"s3a://{S3_BUCKET}/vacuum-{uuid.uuid4().hex[:8]}"
    proc = _child(["vacuum", table, str(tmp_path / "out.json")], tmp_path / "vacuum.log")
    assert proc.wait(480) == 0, (tmp_path / "vacuum.log").read_text()[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == 3
    files = _commit_files(table)
    assert sorted(files)[:4] == [0, 1, 2, 3]  # three appends and the compaction (VACUUM's own after)
    data = sorted(f.name for f in on_disk(table).glob("*.parquet"))
    assert len(data) == 1  # the compacted file; the three it replaced are gone
    assert _rows(table) == [("a", 0), ("a", 1), ("a", 2)]  # and delta-rs reads the same table


class LosingProxy(threading.Thread):
    """A TCP proxy in front of the S3 server that, once armed, lets the PUT of one key reach the
    server and then drops the connection instead of passing the server's reply on."""

    def __init__(self, upstream: str) -> None:
        super().__init__(daemon=True)
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed: bytes | None = None
        self.dropped = 0
        self.lock = threading.Lock()

    def arm(self, key_suffix: str) -> None:
        self.armed = key_suffix.encode()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"drop": False}
            threading.Thread(target=self._requests, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, state), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := client.recv(65536):
                with self.lock:
                    if self.armed and data.startswith(b"PUT ") and self.armed in data.split(b"\r\n", 1)[0]:
                        state["drop"] = True
                        self.armed = None  # once: the client's retry goes through
                server.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(server)

    def _replies(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := server.recv(65536):
                if state["drop"] and not data.startswith(b"HTTP/1.1 100"):
                    with self.lock:
                        self.dropped += 1
                    break  # the server has stored the object; its reply is lost
                client.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(client)
            _hang_up(server)

    def close(self) -> None:
        self.listener.close()


def _hang_up(sock: socket.socket) -> None:
    """Close now: a plain close leaves the connection open while another thread is blocked reading it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def test_a_commit_whose_reply_is_lost_lands_once_and_is_not_a_conflict(tmp_path: Path) -> None:
    from tests.conftest import s3_server

    table = f"s3a://{S3_BUCKET}/lost-{uuid.uuid4().hex[:8]}"
    proxy = LosingProxy(s3_server().endpoint)  # type: ignore[union-attr]
    proxy.start()
    proxy.arm(f"/_delta_log/{1:020d}.json")  # the second append's commit
    try:
        proc = _child(["append", table, "a", "3", str(tmp_path / "a.json")], tmp_path / "a.log",
                      env={"TIDEMARK_S3__ENDPOINT": proxy.endpoint})
        assert proc.wait(480) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        proxy.close()
    assert proxy.dropped == 1  # the reply of version 1's PUT was lost after the server stored it
    files = _commit_files(table)
    # Three appends, three versions: the retried PUT's 412 was recognised as this writer's own
    # commit, not taken as a rival's (which Delta would have retried as version 2: a duplicate).
    assert sorted(files) == [0, 1, 2]
    assert _rows(table) == [("a", 0), ("a", 1), ("a", 2)]
