"""Shared pieces of the ingest tests: a config on disk, `tidemark ingest` as a real
process, a producer writing transactions (some aborted) in the background, and the one
check that matters — the table holds exactly the read_committed records of the topics.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.kafka_helpers import read_all, transactional_producer

SCHEMA = "id BIGINT, note STRING"


def write_config(path: Path, bootstrap: str, target: Path | str, *, topics: list[str] | None = None,
                 name: str = "orders", security: dict[str, Any] | None = None, **pipeline: Any) -> Path:
    source: dict[str, Any] = {"topics": topics} if topics else {}
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, **({"security": security} if security else {})},
        "pipelines": [{"name": name, **source, "target": str(target), "schema": SCHEMA, **pipeline}],
    }))
    return path


@dataclass(frozen=True)
class Pipeline:
    """A pipeline under test: its config file, target table and ledger."""

    topic: str
    config: Path
    target: Path | str
    ledger: Any

    @classmethod
    def create(cls, spark: Any, bootstrap: str, topic: str, tmp: Path, *, security: dict[str, Any] | None = None,
               root: str | None = None, **pipeline: Any) -> Pipeline:
        """The config in ``tmp``; the tables there too, or under ``root`` (the ``table_root`` fixture's)."""
        from offsets.ledger import Ledger

        target: Path | str = f"{root}/orders" if root else tmp / "orders"
        config = write_config(tmp / "tidemark.yaml", bootstrap, target, topics=[topic], security=security, **pipeline)
        return cls(topic, config, target, Ledger(spark, str(target) + "_tidemark_ledger", "orders"))


def ingest_argv(config: Path, *extra: str, pipeline: str = "orders") -> list[str]:
    return [sys.executable, "-m", "tidemark.cli", "ingest", pipeline, "--config", str(config), *extra]


def process_env(crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_CRASH_AT"}
    if crash_at:
        env["TIDEMARK_CRASH_AT"] = crash_at
    return env


def run_ingest(config: Path, crash_at: str | None = None, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ingest_argv(config, *extra), env=process_env(crash_at), capture_output=True, text=True,
                          timeout=600, check=False)


class BackgroundProducer(threading.Thread):
    """Writes transactions of 1-20 JSON records until stopped; about one in five aborts.

    Every record's ``id`` is unique, so a duplicate in the table shows up as a repeated id
    as well as a repeated (topic, partition, offset).
    """

    def __init__(self, bootstrap: str, topic: str, *, seed: int = 7, pause: float = 0.02,
                 abort_ratio: float = 0.2, client: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.producer = transactional_producer(bootstrap, client=client)
        self.topic = topic
        self.random = random.Random(seed)
        self.pause = pause
        self.abort_ratio = abort_ratio
        self.stopping = threading.Event()
        self.committed = 0
        self.aborted = 0
        self.next_id = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.producer.begin_transaction()
                size = self.random.randint(1, 20)
                for _ in range(size):
                    value = json.dumps({"id": self.next_id, "note": "x" * self.random.randint(10, 200)})
                    self.producer.produce(self.topic, value=value.encode(), key=str(self.next_id % 13).encode())
                    self.next_id += 1
                self.producer.flush(30)  # librdkafka#4849: an abort racing the partitions' registration fails
                if self.random.random() < self.abort_ratio:
                    self.producer.abort_transaction(30)
                    self.aborted += 1
                else:
                    self.producer.commit_transaction(30)
                    self.committed += 1
                self.stopping.wait(self.pause)
        except BaseException as exc:  # noqa: BLE001  (surfaced by stop())
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        if self.error is not None:
            raise AssertionError(f"background producer failed: {self.error!r}")
        assert self.committed > 0 and self.aborted > 0, (self.committed, self.aborted)


def table_keys(spark: Any, path: str) -> list[tuple[str, int, int]]:
    rows = spark.read.format("delta").load(path).select("_kafka_topic", "_kafka_partition", "_kafka_offset").collect()
    return sorted((r[0], r[1], r[2]) for r in rows)


def kafka_keys(bootstrap: str, topics: list[str], client: dict[str, Any] | None = None) -> list[tuple[str, int, int]]:
    return sorted((t, r.partition, r.offset) for t in topics for r in read_all(bootstrap, t, extra=client))


def assert_exactly_once(spark: Any, target: str, bootstrap: str, topics: list[str],
                        client: dict[str, Any] | None = None) -> int:
    """The table's (topic, partition, offset) set equals the topics' read_committed records
    (``client``: a secured cluster's librdkafka properties)."""
    in_table = table_keys(spark, target)
    twice = [k for k, n in Counter(in_table).items() if n > 1]
    assert not twice, f"{len(twice)} records written twice, e.g. {twice[:5]}"
    in_kafka = kafka_keys(bootstrap, topics, client)
    missing = sorted(set(in_kafka) - set(in_table))
    extra = sorted(set(in_table) - set(in_kafka))
    assert not missing and not extra, f"missing {len(missing)} (e.g. {missing[:5]}), extra {len(extra)} (e.g. {extra[:5]})"
    ids = [r.id for r in spark.read.format("delta").load(target).select("id").collect()]
    assert len(ids) == len(set(ids)), "a payload id appears twice"
    return len(in_table)


def target_commits_per_batch(spark: Any, target: str, pipeline: str = "orders") -> Counter[int]:
    """How many target commits carry each batch id (exactly-once means at most one each)."""
    from delta.tables import DeltaTable

    from offsets.ledger import batch_of_commit

    batches = Counter[int]()
    for row in DeltaTable.forPath(spark, target).history().select("userMetadata").collect():
        batch = batch_of_commit(row.userMetadata, pipeline)
        if batch is not None:
            batches[batch] += 1
    return batches


def delta_versions(table: Path | str) -> int:
    """Committed versions of a Delta table, from its log's file names (no Spark needed)."""
    from tests.conftest import on_disk

    log = on_disk(str(table)) / "_delta_log"
    return sum(1 for f in log.glob("*.json") if f.stem.isdigit()) if log.is_dir() else 0


def wait_while_running(done: Callable[[], bool], proc: subprocess.Popen[Any], log: Path, what: str,
                       timeout: float, interval: float) -> None:
    """Until ``done()``, failing if the ingest ``proc`` (output in ``log``) exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"ingest exited {proc.returncode}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s: {log.read_text()[-2000:]}"
        time.sleep(interval)


def wait_for_new_version(table: Path | str, before: int, proc: subprocess.Popen[Any], log: Path,
                         timeout: float = 180) -> None:
    """Until ``table`` has more than ``before`` versions, while the ingest ``proc`` (output in ``log``) runs."""
    wait_while_running(lambda: delta_versions(table) > before, proc, log, "commit", timeout, 0.2)
