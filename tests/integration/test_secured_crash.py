"""The secured stack under SIGKILL, and the whole product searched for its password (slow stage).

This is also the slow stage's every-step SIGKILL harness of the ingest (the random-kill one
stays on plaintext, ``test_ingest_crash.py``).

One pipeline over SASL_SSL as the least-privileged ``ingest`` principal, given as the
pipeline's own credentials, whose password is written in clear in ``tidemark.yaml`` (the
worst a user may do): ``tidemark ingest`` is
SIGKILLed at every step of the commit protocol while a producer writes, and restarted;
then ``--follow``, ``check``, ``offsets show``, ``status``, ``backfill`` and a Prefect flow run
over the same cluster. The table must hold every committed record once, and the password
must appear nowhere the product wrote: its output, its logs and quality docs under
``TIDEMARK_HOME``, the Delta logs of target, ledger and backfill, and the Prefect server's
flow runs (parameters, state) and artifacts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.acls import apply, ingest_grants
from connectors.kafka_config import librdkafka_config
from infra.kafka import EmbeddedKafka
from offsets.protocol import CRASH_POINTS
from tests.ingest_harness import (
    BackgroundProducer,
    Pipeline,
    assert_exactly_once,
    process_env,
    target_commits_per_batch,
)
from tests.orchestration_harness import flow_outcome, prefect_env, start_flow
from tests.stack_fixtures import CANARY, secured_kafka
from tidemark.config import KafkaConnection, load_config
from tidemark.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def sasl(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with secured_kafka(settings, tmp_path_factory.mktemp("kafka-sasl-crash"), "sasl_ssl") as cluster:
        yield cluster


def _client(cluster: EmbeddedKafka, principal: str) -> dict[str, Any]:
    conf = librdkafka_config(KafkaConnection(security=cluster.client_security(principal)), cluster.bootstrap_servers)
    conf.pop("logger", None)
    conf.pop("bootstrap.servers")
    return conf


class _Product:
    """Runs ``tidemark`` commands of one pipeline as processes, keeping all they print."""

    def __init__(self, p: Pipeline, tmp_path: Path) -> None:
        self.p, self.tmp = p, tmp_path
        self.home = tmp_path / "home"
        self.env = {**process_env(), "TIDEMARK_HOME": str(self.home)}
        self.outputs: list[str] = []

    def run(self, *argv: str, crash_at: str | None = None, expect: int = 0) -> None:
        proc = subprocess.run([sys.executable, "-m", "tidemark.cli", *argv],
                              env={**self.env, **({"TIDEMARK_CRASH_AT": crash_at} if crash_at else {})},
                              capture_output=True, text=True, timeout=600, check=False)
        self.outputs.append(proc.stdout + proc.stderr)
        assert proc.returncode == expect, f"{argv} at {crash_at}: exit {proc.returncode}\n{proc.stderr[-2000:]}"

    def ingest(self, crash_at: str | None = None) -> None:
        self.run("ingest", "orders", "--config", str(self.p.config), crash_at=crash_at,
                 expect=-9 if crash_at else 0)

    def follow(self, seconds: float) -> None:
        """``ingest --follow`` until it has committed a batch, ``seconds`` more, then SIGTERM."""
        log = self.tmp / "follow.log"
        with log.open("w") as sink:
            follow = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "-v", "ingest", "orders", "--config",
                                       str(self.p.config), "--follow"], env=self.env, stdout=sink,
                                      stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 300
            while not re.search(r"batch \d+ committed", log.read_text(errors="replace")):
                assert follow.poll() is None, f"--follow exited {follow.returncode}:\n{log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"--follow committed nothing:\n{log.read_text()[-2000:]}"
                time.sleep(0.5)
            time.sleep(seconds)
            follow.send_signal(signal.SIGTERM)
            assert follow.wait(120) == 0, log.read_text()[-2000:]
        self.outputs.append(log.read_text())

    def the_rest(self) -> None:
        """``check``, ``offsets show``, ``status`` and ``backfill``."""
        config = str(self.p.config)
        self.run("check", "orders", "--config", config)
        self.run("offsets", "show", "orders", "--config", config)
        self.run("status", "--config", config)
        self.run("backfill", "orders", "--into", str(self.tmp / "backfill"), "--batches", "1-2", "--config", config)

    def flow(self, prefect_api: str) -> str:
        """One ingest flow run on the Prefect server, in its own process; its id."""
        flow_log = self.tmp / "flow.log"
        flow = start_flow("ingest_flow", {"pipeline": "orders", "config": str(self.p.config)},
                          {**prefect_env(prefect_api, self.tmp / "prefect-home"), "TIDEMARK_HOME": str(self.home)},
                          flow_log)
        flow.wait(600)
        outcome = flow_outcome(flow_log)
        assert outcome["type"] == "COMPLETED", outcome
        self.outputs.append(flow_log.read_text(errors="replace"))
        return str(outcome["id"])

    def serve_until_a_batch(self, prefect_api: str) -> str:
        """``tidemark serve`` (the config schedules an ingest every few seconds, run in serve's
        warm driver) until a scheduled run has committed a batch; the id of a completed run."""
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

        log = self.tmp / "serve.log"
        with log.open("wb") as out:
            serve = subprocess.Popen([sys.executable, "-m", "tidemark.cli", "serve", "--config", str(self.p.config)],
                                     env={**prefect_env(prefect_api, self.tmp / "prefect-home"),
                                          "TIDEMARK_HOME": str(self.home)}, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 400
            while not re.search(r"orders: [1-9]\d* batch\(es\)", log.read_text(errors="replace")):
                assert serve.poll() is None, f"serve exited {serve.returncode}:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no served batch:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        finally:
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(120) == 0, log.read_text(errors="replace")[-3000:]
        self.outputs.append(log.read_text(errors="replace"))
        with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
            completed = client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["ingest-orders"])),
                sort=FlowRunSort.ID_DESC, limit=10, flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))))
        assert completed and all(r.auto_scheduled for r in completed)
        return str(completed[0].id)

    def assert_nowhere(self, secret: str, prefect_api: str, flow_run_id: str) -> None:
        """``secret`` is in none of: the output, every file under ``TIDEMARK_HOME`` (logs, GX Data
        Docs, keystores), the Delta logs of target, ledger and backfill, the Prefect server's
        flow run, artifact and logs; yet it is in ``tidemark.yaml``, where the search would find it."""
        for text in self.outputs:
            assert secret not in text
        written = [f for f in self.home.rglob("*") if f.is_file()]
        for table in (self.p.target, Path(str(self.p.target) + "_tidemark_ledger"), self.tmp / "backfill"):
            written += [f for f in table.rglob("*") if f.is_file() and "_delta_log" in f.parts]
        assert any("logs" in f.parts for f in written) and any(f.suffix == ".json" for f in written)
        for f in written:
            assert secret.encode() not in f.read_bytes(), f"the secret is in {f}"
        for what in _prefect_records(prefect_api, flow_run_id):
            assert secret not in what
        assert secret in self.p.config.read_text()


def test_sigkill_at_every_step_over_sasl_ssl_and_the_password_leaks_nowhere(
        spark: Any, sasl: EmbeddedKafka, prefect_api: str, tmp_path: Path) -> None:
    admin = _client(sasl, "admin")
    topic = "secured.crash.orders"
    creator = AdminClient({**admin, "bootstrap.servers": sasl.bootstrap_servers})
    creator.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    password = sasl.password_file("ingest").read_text().strip()
    assert password.startswith(CANARY)
    security = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "ingest",
                "sasl_password": password, "ssl_ca_location": str(sasl.ca.certificate)}
    # The pipeline's own credentials (kafka.security stays plaintext): every command must use them.
    p = Pipeline.create(spark, sasl.bootstrap_servers, topic, tmp_path, kafka_security=security,
                        max_records_per_batch=2000, transactions={"manifest_topic": None})
    apply({**admin, "bootstrap.servers": sasl.bootstrap_servers}, ingest_grants(load_config(p.config), "User:ingest"))
    product = _Product(p, tmp_path)
    producer = BackgroundProducer(sasl.bootstrap_servers, topic, pause=0.2, client=admin)
    producer.start()
    try:
        # Each run first recovers what the previous one's kill left (step 1), then dies at the
        # next step on a new batch. Except after "claimed": that recovery replays the batch
        # through step 4, so the run armed for "committed" would die inside the replay, not
        # after a new batch's commit; a clean run recovers it first.
        for point in CRASH_POINTS:
            product.ingest(crash_at=point)
            if point == "claimed":
                product.ingest()
        product.ingest()
        product.follow(5)
    finally:
        producer.stop()
    product.ingest()
    assert assert_exactly_once(spark, str(p.target), sasl.bootstrap_servers, [topic], admin) > 0
    assert max(target_commits_per_batch(spark, str(p.target)).values()) == 1
    product.the_rest()
    product.assert_nowhere(password, prefect_api, product.flow(prefect_api))


def test_the_whole_product_over_mutual_tls_with_an_encrypted_key_that_leaks_nowhere(
        spark: Any, settings: Settings, prefect_api: str, tmp_path: Path) -> None:
    """Over mTLS, as ``ingest`` by its certificate, whose key file is encrypted with a password
    written in clear in ``tidemark.yaml``: ingest (bounded, ``--follow`` and scheduled under
    ``tidemark serve``) under a producer, ``check``, ``offsets show``, ``status`` and
    ``backfill``; exactly once, and the key's password nowhere (Spark's keystore holds the key encrypted with it, not it)."""
    with secured_kafka(settings, tmp_path / "kafka", "mtls") as cluster:
        admin = _client(cluster, "admin")
        topic = "secured.mtls.product"
        creator = AdminClient({**admin, "bootstrap.servers": cluster.bootstrap_servers})
        creator.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
        key_password = f"{CANARY}-key-{os.urandom(6).hex()}"
        pem = cluster.ca.issue("ingest", directory=tmp_path / "client", key_password=key_password)
        assert b"ENCRYPTED" in pem.key.read_bytes()
        security = {"protocol": "SSL", "ssl_ca_location": str(cluster.ca.certificate),
                    "ssl_certificate_location": str(pem.certificate), "ssl_key_location": str(pem.key),
                    "ssl_key_password": key_password}
        p = Pipeline.create(spark, cluster.bootstrap_servers, topic, tmp_path, kafka_security=security,
                            max_records_per_batch=500, transactions={"manifest_topic": None},
                            schedule={"ingest_every_seconds": 5, "audit_every_seconds": None,
                                      "maintain_every_seconds": None})
        grants = ingest_grants(load_config(p.config), "User:ingest")
        apply({**admin, "bootstrap.servers": cluster.bootstrap_servers}, grants)
        product = _Product(p, tmp_path)
        producer = BackgroundProducer(cluster.bootstrap_servers, topic, pause=0.2, client=admin)
        producer.start()
        try:
            product.ingest()
            product.follow(5)
            served = product.serve_until_a_batch(prefect_api)
        finally:
            producer.stop()
        product.ingest()
        assert assert_exactly_once(spark, str(p.target), cluster.bootstrap_servers, [topic], admin) > 0
        product.the_rest()
        product.assert_nowhere(key_password, prefect_api, served)


def _prefect_records(api_url: str, flow_run_id: str) -> list[str]:
    """The flow run (parameters, state, result), its report artifact and the newest logs, as the server
    stores them: read over its REST API, which wants every filter, sort, limit and offset given."""
    import urllib.request

    def call(path: str, body: dict[str, Any] | None = None) -> str:
        request = urllib.request.Request(f"{api_url}/{path}", method="POST" if body is not None else "GET",
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()

    run = call(f"flow_runs/{flow_run_id}")
    # By key: a task-run filter, which this server insists on, would leave out a flow's own artifacts.
    artifact = call("artifacts/ingest-orders/latest")
    logs = call("logs/filter", {"logs": {}, "limit": 200, "offset": 0, "sort": "TIMESTAMP_DESC"})
    assert flow_run_id in run and '"parameters"' in run and flow_run_id in artifact and json.loads(logs)
    return [run, artifact, logs]


@pytest.mark.parametrize("security", ["sasl_ssl"])  # mTLS: the whole product over it, above
def test_three_secured_brokers_replicate_and_serve_a_least_privileged_ingest(
        spark: Any, settings: Settings, security: str, tmp_path: Path) -> None:
    """Brokers talk to each other over the secured listener (as ``admin`` by SCRAM, or by the
    brokers' certificate): a topic of replication factor 3 keeps all replicas in sync, and
    the ingest reads it exactly once as ``ingest`` with only its ACLs."""
    from connectors.topic_reader import read_to_end
    from pipelines.ingest import IngestJob
    from tests.kafka_helpers import transactional_producer, write_transaction

    with secured_kafka(settings, tmp_path / "kafka", security, brokers=3) as cluster:
        admin = _client(cluster, "admin")
        topic = f"secured.three.{security}"
        creator = AdminClient({**admin, "bootstrap.servers": cluster.bootstrap_servers})
        creator.create_topics([NewTopic(topic, 3, 3)])[topic].result(60)
        producer = transactional_producer(cluster.bootstrap_servers, client=admin)
        for t in range(8):
            write_transaction(producer, topic, [json.dumps({"id": t * 10 + i, "note": "n"}).encode()
                                                for i in range(10)], commit=t % 4 != 3)
        partitions = creator.list_topics(topic, timeout=15).topics[topic].partitions.values()
        assert all(len(p.replicas) == 3 and len(p.isrs) == 3 for p in partitions)
        p = Pipeline.create(spark, cluster.bootstrap_servers, topic, tmp_path,
                            security={k: str(v) if isinstance(v, Path) else v for k, v in
                                      cluster.client_security("ingest").model_dump(
                                          exclude_none=True, exclude_defaults=True).items()},
                            transactions={"manifest_topic": None})
        config = load_config(p.config)
        apply({**admin, "bootstrap.servers": cluster.bootstrap_servers}, ingest_grants(config, "User:ingest"))
        report = IngestJob(spark, config, config.pipelines[0], cluster.bootstrap_servers).run_bounded()
        assert report.rows == 60 == len(read_to_end(cluster.bootstrap_servers, topic, extra=admin))
        assert assert_exactly_once(spark, str(p.target), cluster.bootstrap_servers, [topic], admin) == 60
