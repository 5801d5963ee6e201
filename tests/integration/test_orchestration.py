"""Prefect orchestration against a real Prefect server, broker, Spark and Delta.

Flows run as separate processes, as they do under ``tidemark serve``, and every verdict
is read back from the table, the ledger or the Prefect server's own records.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from infra.process import free_port
from tests.ingest_harness import assert_exactly_once, target_commits_per_batch, write_config
from tests.kafka_helpers import transactional_producer, write_transaction
from tests.orchestration_harness import (
    delayed_proxy,
    flow_outcome,
    prefect_env,
    start_flow,
    task_run_counts,
    wait_for_line,
)

pytestmark = pytest.mark.timeout(900)


def _produce(bootstrap: str, topic: str, transactions: int = 3, size: int = 40) -> None:
    producer = transactional_producer(bootstrap)
    for t in range(transactions):
        write_transaction(producer, topic, [f'{{"id": {t * size + i}, "note": "n"}}'.encode() for i in range(size)],
                          commit=True)


def test_a_second_run_of_a_pipeline_waits_and_a_third_is_refused(
        prefect_api: str, spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("orch", partitions=2)
    _produce(kafka_bootstrap, topic)
    target = tmp_path / "orders"
    patient = write_config(tmp_path / "tidemark.yaml", kafka_bootstrap, target, topics=[topic], name="pair")
    impatient = write_config(tmp_path / "impatient.yaml", kafka_bootstrap, target, topics=[topic], name="pair",
                             schedule={"wait_for_slot_seconds": 1})
    env = prefect_env(prefect_api, tmp_path / "prefect-home")
    logs = [tmp_path / f"run-{i}.log" for i in range(3)]
    first = start_flow("ingest_flow", {"pipeline": "pair", "config": str(patient)}, env, logs[0])
    wait_for_line(logs[0], "holding the slot of pipeline pair", first)
    # While the first holds the slot (its Spark start and ingest take seconds), two rivals ask.
    second = start_flow("ingest_flow", {"pipeline": "pair", "config": str(patient)}, env, logs[1])
    third = start_flow("ingest_flow", {"pipeline": "pair", "config": str(impatient)}, env, logs[2])
    for proc in (first, second, third):
        proc.wait(600)
    a, b, c = (flow_outcome(log) for log in logs)

    assert a["type"] == "COMPLETED" and b["type"] == "COMPLETED", (a, b)
    assert b["result"]["slot"]["acquired_at"] >= a["result"]["slot"]["released_at"], "the runs overlapped"
    assert b["result"]["slot"]["waited_seconds"] > 1.0, "the second run never had to wait: no contention shown"
    assert a["result"]["rows"] == 120 and b["result"]["rows"] == 0 and b["result"]["lag"] == 0
    assert c["type"] == "FAILED" and "held its slot" in c["result"], c
    assert task_run_counts(prefect_api, c["id"]) == [], "the refused run must not have started its work"
    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])
    assert set(target_commits_per_batch(spark, str(target), "pair").values()) == {1}


def test_a_transient_failure_is_retried_and_a_terminal_one_is_not(
        prefect_api: str, spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("orch", partitions=1)
    _produce(kafka_bootstrap, topic, transactions=2)
    env = prefect_env(prefect_api, tmp_path / "prefect-home")
    host, port = kafka_bootstrap.rsplit(":", 1)
    target = tmp_path / "retried"
    with delayed_proxy((host, int(port))) as (proxy_port, open_proxy):
        # Kafka unreachable at first: metadata fails with ServiceUnavailableError (transient).
        config = write_config(tmp_path / "tidemark.yaml", f"127.0.0.1:{proxy_port}", target, topics=[topic],
                              name="flaky", schedule={"retries": 2, "retry_delay_seconds": 15})
        log = tmp_path / "transient.log"
        proc = start_flow("ingest_flow", {"pipeline": "flaky", "config": str(config)}, env, log)
        wait_for_line(log, "Retry 1/2 will start", proc)
        open_proxy.set()  # the broker is back before the retry
        proc.wait(600)
    outcome = flow_outcome(log)
    assert "ServiceUnavailableError" in log.read_text(errors="replace")
    assert outcome["type"] == "COMPLETED" and outcome["result"]["rows"] == 80, outcome
    assert task_run_counts(prefect_api, outcome["id"]) == [2]
    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])

    # A topic that does not exist is a TerminalError: the run fails at once, no retry.
    bad = write_config(tmp_path / "bad.yaml", kafka_bootstrap, tmp_path / "never", topics=[f"{topic}-missing"],
                       name="broken", schedule={"retries": 2, "retry_delay_seconds": 1})
    log = tmp_path / "terminal.log"
    start_flow("ingest_flow", {"pipeline": "broken", "config": str(bad)}, env, log).wait(600)
    outcome = flow_outcome(log)
    assert outcome["type"] == "FAILED" and "do not exist" in outcome["result"], outcome
    assert task_run_counts(prefect_api, outcome["id"]) == [1]
    assert "Retry" not in log.read_text(errors="replace")


def test_a_served_schedule_runs_a_real_ingest(
        prefect_api: str, spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    topic = topic_factory("orch", partitions=2)
    _produce(kafka_bootstrap, topic)
    target = tmp_path / "served"
    config = write_config(tmp_path / "tidemark.yaml", kafka_bootstrap, target, topics=[topic], name="served",
                          schedule={"ingest_every_seconds": 5, "audit_every_seconds": None,
                                    "maintain_every_seconds": 3600})
    log = tmp_path / "serve.log"
    port = free_port()
    with log.open("wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "serve", "--config", str(config),
                                  "--metrics-port", str(port)],
                                 env=prefect_env(prefect_api, tmp_path / "prefect-home"), stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, "served: 1 batch(es), 120 rows", serve, timeout=400)
        # The batch was committed in serve's own warm driver: serve's metrics counted it.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        assert 'tidemark_batch_rows_total{pipeline="served"} 120.0' in scraped, scraped
        # The maintenance deployment (hourly) runs beside the 5-second ingest schedule, in its own slot.
        from prefect.deployments import run_deployment

        with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
            maintained = run_deployment("tidemark-maintain/maintain-served", timeout=400)
        assert maintained.state is not None and maintained.state.is_completed(), maintained.state
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    assert_exactly_once(spark, str(target), kafka_bootstrap, [topic])
    operations = [r.operation for r in DeltaTable.forPath(spark, str(target)).history().collect()]
    assert "OPTIMIZE" in operations, operations
    # Ask for the completed runs themselves: a 5-second schedule keeps ~100 future runs
    # scheduled, and a page of all runs may hold none of the completed ones.
    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        deployment = DeploymentFilter(name=DeploymentFilterName(any_=["ingest-served"]))
        completed = client.read_flow_runs(
            deployment_filter=deployment, sort=FlowRunSort.ID_DESC, limit=100,
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))))
        runs = client.read_flow_runs(deployment_filter=deployment, sort=FlowRunSort.ID_DESC, limit=10)
    assert completed, [(r.name, r.state_name) for r in runs]
    assert all(r.state_type == StateType.COMPLETED for r in completed)
    assert all(r.auto_scheduled for r in completed), "runs came from the schedule, not by hand"
