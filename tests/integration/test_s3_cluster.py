"""Ingest on a Spark standalone cluster whose only shared storage is the S3 server.

A master and a worker (its executors are JVMs of their own, with their own working
directory), ``tidemark ingest`` as the cluster's driver, every table on ``s3a://``: a run
SIGKILLed right after it claims a batch, then a clean run, leave the table exactly the
topic's read_committed records, and the batches' tasks ran on the worker's executors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.process import free_port
from tests.ingest_harness import Pipeline, assert_exactly_once, run_ingest
from tests.kafka_helpers import transactional_producer

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("needs_s3"), pytest.mark.timeout(900)]


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``(master URL, the worker's working directory)`` of a fresh one-worker standalone cluster on 127.0.0.1."""
    port, worker_dir = free_port(), tmp_path / "worker"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path),
           "SPARK_WORKER_DIR": str(worker_dir), "PYSPARK_PYTHON": sys.executable}
    master = subprocess.Popen([_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())],
                              env=env, stdout=(tmp_path / "master.log").open("w"), stderr=subprocess.STDOUT)
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen([_spark_class(), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                               "--cores", "2", "--memory", "1536m", "--work-dir", str(worker_dir),
                               "--webui-port", str(free_port())],
                              env=env, stdout=(tmp_path / "worker.log").open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text():
            assert master.poll() is None and worker.poll() is None, (tmp_path / "master.log").read_text()[-2000:]
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url, worker_dir
    finally:
        for proc in (worker, master):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_standalone_cluster_with_only_s3_shared_ingests_exactly_once(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path, table_root: str,
        standalone: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, worker_dir = standalone
    topic = topic_factory("cluster", partitions=3)
    producer = transactional_producer(kafka_bootstrap)
    for n in range(30):  # 30 transactions of 20 records; every third aborted
        producer.begin_transaction()
        for i in range(20):
            producer.produce(topic, json.dumps({"id": n * 100 + i, "note": "x"}).encode(), partition=i % 3)
        producer.flush(30)
        (producer.abort_transaction if n % 3 == 2 else producer.commit_transaction)(30)
    p = Pipeline.create(spark, kafka_bootstrap, topic, tmp_path, root=table_root, max_records_per_batch=150)
    monkeypatch.setenv("TIDEMARK_SPARK__MASTER", url)
    monkeypatch.setenv("TIDEMARK_SPARK__CLASS_DATA_SHARING", "false")

    killed = run_ingest(p.config, "claimed")  # SIGKILLed right after its batch's claim: a replay next
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = run_ingest(p.config)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replayed" in done.stderr

    assert assert_exactly_once(spark, str(p.target), kafka_bootstrap, [topic]) == 400
    executors = list(worker_dir.glob("app-*/*/stderr"))
    assert len(executors) >= 2, "each run's tasks ran on the worker's executors"
    assert any("Finished task" in e.read_text() for e in executors)
