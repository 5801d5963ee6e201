"""``tidemark serve``'s warm driver: runs that fail or are killed inside it do not poison the next ones.

Real Prefect server, broker, Spark and Delta; ``tidemark serve`` as a process, its
schedules starting the runs. Every verdict is read back from the tables and topics.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.ingest_harness import SCHEMA, assert_exactly_once, delta_versions, target_commits_per_batch
from tests.kafka_helpers import transactional_producer, write_transaction
from tests.orchestration_harness import prefect_env, wait_for_line


def _produce(bootstrap: str, topic: str, first_id: int, transactions: int, size: int) -> None:
    producer = transactional_producer(bootstrap)
    for t in range(transactions):
        ids = range(first_id + t * size, first_id + (t + 1) * size)
        write_transaction(producer, topic, [f'{{"id": {i}, "note": "{"n" * 80}"}}'.encode() for i in ids],
                          commit=True)


def _config(path: Path, bootstrap: str, pipelines: dict[str, tuple[str, Path]]) -> Path:
    schedule = {"ingest_every_seconds": 5, "audit_every_seconds": None, "maintain_every_seconds": 3600,
                "wait_for_slot_seconds": 120, "retries": 0}
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": name, "topics": [topic], "target": str(target), "schema": SCHEMA, "schedule": schedule,
         "max_records_per_batch": 1_000_000} for name, (topic, target) in pipelines.items()]}))
    return path


def _spark_drivers(proc: subprocess.Popen[bytes]) -> set[int]:
    """The pids of the Spark driver JVMs under ``proc`` now.

    A driver is a JVM running ``SparkSubmit``. Counting every process named ``java``
    also counted passers-by: spark-submit's launcher JVM (its arguments name
    ``SparkSubmit`` too), and a driver's child in the instant between fork and exec
    (Hadoop's local file system forks a ``chmod`` per permission change), which is
    named ``java`` and shows the driver's command line.
    """
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return set()
    jvms: dict[int, tuple[int, list[str]]] = {}
    for child in children:
        try:
            if child.name() == "java":
                jvms[child.pid] = (child.ppid(), child.cmdline())
        except psutil.Error:  # gone since the listing
            pass
    return {pid for pid, (parent, argv) in jvms.items()
            if "org.apache.spark.deploy.SparkSubmit" in argv and "org.apache.spark.launcher.Main" not in argv
            and parent not in jvms}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_killed_and_a_failed_run_leave_the_next_runs_of_both_pipelines_exactly_once(
        prefect_api: str, spark, kafka_bootstrap: str, topic_factory, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    big, small = topic_factory("warm-big", partitions=2), topic_factory("warm-small", partitions=1)
    _produce(kafka_bootstrap, big, 0, transactions=150, size=1000)  # alpha's first batch writes for seconds
    _produce(kafka_bootstrap, small, 0, transactions=5, size=20)
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    config = _config(tmp_path / "tidemark.yaml", kafka_bootstrap, {"alpha": (big, alpha), "beta": (small, beta)})
    log = tmp_path / "serve.log"
    # beta's first batch fails inside the driver after its claim; alpha's flow run is SIGKILLed mid-write.
    env = {**prefect_env(prefect_api, tmp_path / "prefect-home"), "TIDEMARK_RAISE_AT": "claimed:beta"}
    info = settings.home_dir / "logs" / "tidemark.log"  # where serve's INFO lines go (tidemark.logs)
    info_from = info.stat().st_size if info.exists() else 0

    def serve_info() -> str:
        with info.open("rb") as f:
            f.seek(info_from)
            return f.read().decode(errors="replace")

    with log.open("wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "serve", "--config", str(config)],
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
    drivers: set[int] = set()  # every Spark driver JVM seen under serve
    try:
        alpha_ledger = Path(f"{alpha}_tidemark_ledger")
        deadline = time.monotonic() + 400
        while not (delta_versions(alpha_ledger) > 0 and delta_versions(alpha) == 0):  # claimed, not written
            assert delta_versions(alpha) == 0, "alpha's batch committed before the test could kill its run"
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            drivers |= _spark_drivers(serve)
            time.sleep(0.1)
        runs = re.findall(r"running ingest of alpha for flow run \S+ \(pid (\d+)\)", serve_info())
        assert runs, serve_info()[-3000:]
        os.kill(int(runs[-1]), signal.SIGKILL)
        wait_for_line(log, "ingest of alpha cancelled", serve, timeout=120)
        wait_for_line(log, "injected failure at step 'claimed' of pipeline 'beta'", serve, timeout=300)
        assert delta_versions(alpha) == 0, "the killed run's batch must not have been committed"

        # More data for both; the next scheduled runs must take all of it, exactly once.
        _produce(kafka_bootstrap, big, 150_000, transactions=10, size=100)
        _produce(kafka_bootstrap, small, 100, transactions=5, size=20)
        deadline = time.monotonic() + 400
        for target, topic in ((alpha, big), (beta, small)):
            while True:
                drivers |= _spark_drivers(serve)
                assert serve.poll() is None, log.read_text(errors="replace")[-3000:]
                try:
                    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])
                    break
                except Exception:  # noqa: BLE001 - not there yet (or not even a table)
                    assert time.monotonic() < deadline, log.read_text(errors="replace")[-5000:]
                    time.sleep(2)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    text = log.read_text(errors="replace")
    for name, target in (("alpha", alpha), ("beta", beta)):
        batches = target_commits_per_batch(spark, str(target), name)
        assert batches and set(batches.values()) == {1}, (name, batches)
        assert 1 in batches, f"{name}'s interrupted batch 1 was recovered and committed once"
    # Both batch 1s were claimed and then left unwritten: each pipeline's next run replayed its own.
    assert len(re.findall(r"replayed batch 1 \(", text)) == 2, text[-3000:]
    assert len(drivers) == 1, f"Spark drivers {sorted(drivers)} under serve: every run must use the one warm driver"
