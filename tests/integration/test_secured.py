"""Secured clusters on real brokers: SASL_SSL with SCRAM-SHA-512 and mutual TLS, an
authorizer that denies what no ACL allows, least-privileged relay and ingest principals,
and one clear line for every refused credential — never a hang.

Each cluster is the embedded one ``TIDEMARK_KAFKA__SECURITY`` starts (``infra.kafka``), with
its own throwaway CA, on free ports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import SecretStr

from connectors.acls import apply, ingest_grants, relay_grants
from connectors.kafka_config import librdkafka_config
from connectors.preflight import check_access, check_postgres
from connectors.topic_reader import read_to_end
from infra.kafka import EmbeddedKafka
from infra.postgres import EmbeddedPostgres
from pipelines.ingest import IngestJob
from tests.kafka_helpers import write_transaction
from tests.relay_harness import AGGREGATES, RelaySetup, Writers, assert_relayed_exactly_once
from tests.stack_fixtures import free_port_block, secured_kafka
from tidemark.config import KafkaConnection, KafkaSecurity, TidemarkConfig, parse_config
from tidemark.errors import KafkaAccessError, PostgresAccessError, ServiceUnavailableError
from tidemark.settings import Settings


@pytest.fixture(scope="module")
def sasl(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with secured_kafka(settings, tmp_path_factory.mktemp("kafka-sasl"), "sasl_ssl") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pg_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """PostgreSQL that takes TLS with a scram-sha-256 password only; its DSN verifies the certificate."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg-tls"), port=free_port_block(2, start=26432), tls=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mtls(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with secured_kafka(settings, tmp_path_factory.mktemp("kafka-mtls"), "mtls") as cluster:
        yield cluster


def _client(cluster: EmbeddedKafka, principal: str = "admin", **change: Any) -> dict[str, Any]:
    security = cluster.client_security(principal).model_copy(update=change)
    conf = librdkafka_config(KafkaConnection(security=security), cluster.bootstrap_servers)
    conf.pop("logger", None)
    return conf


def _security_yaml(security: KafkaSecurity) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v
            for k, v in security.model_dump(exclude_none=True, exclude_defaults=True).items()}


def _topic(cluster: EmbeddedKafka, name: str, partitions: int = 3) -> str:
    admin = AdminClient(_client(cluster))
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _produce(cluster: EmbeddedKafka, topic: str, transactions: int, per: int, *, commit_every: int = 1) -> None:
    """Transactions of ``per`` JSON records each, as the super user; every ``commit_every``-th
    one aborted when ``commit_every`` > 1."""
    producer = Producer({**_client(cluster), "transactional.id": f"secured-{topic}"})
    producer.init_transactions(30)
    for t in range(transactions):
        write_transaction(producer, topic, [json.dumps({"id": t * per + i, "note": f"t{t}"}).encode() for i in range(per)],
                          commit=not (commit_every > 1 and t % commit_every == commit_every - 1))


def _pipeline_config(cluster: EmbeddedKafka, topic: str, target: Path, principal: str) -> TidemarkConfig:
    return parse_config({
        "kafka": {"bootstrap_servers": cluster.bootstrap_servers,
                  "security": _security_yaml(cluster.client_security(principal))},
        "pipelines": [{"name": "orders", "topics": [topic], "target": str(target), "schema": "id INT, note STRING",
                       "transactions": {"manifest_topic": None}}]})


def _table_holds_the_topic(spark: Any, cluster: EmbeddedKafka, topic: str, target: str) -> int:
    """Assert the table's (topic, partition, offset) set is the topic's read_committed content; its size."""
    expected = sorted((topic, r.partition, r.offset) for r in read_to_end(
        cluster.bootstrap_servers, topic, extra={k: v for k, v in _client(cluster).items()
                                                  if k != "bootstrap.servers"}))
    rows = spark.read.format("delta").load(target).select(
        "_kafka_topic", "_kafka_partition", "_kafka_offset").collect()
    assert sorted((r[0], r[1], r[2]) for r in rows) == expected
    return len(expected)


def _ingest_exactly_once(spark: Any, cluster: EmbeddedKafka, tmp: Path, name: str) -> TidemarkConfig:
    topic = _topic(cluster, name)
    _produce(cluster, topic, transactions=12, per=10, commit_every=4)
    config = _pipeline_config(cluster, topic, tmp / "orders", "ingest")
    apply(_client(cluster), ingest_grants(config, "User:ingest"))
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, cluster.bootstrap_servers).run_bounded()
    assert _table_holds_the_topic(spark, cluster, topic, pipeline.target) == 90  # 9 of 12 committed
    assert report.rows == 90
    again = IngestJob(spark, config, pipeline, cluster.bootstrap_servers).run_bounded()
    assert again.batches == []
    return config


def test_ingest_over_sasl_ssl_as_a_least_privileged_principal_leaks_no_password(
        spark: Any, sasl: EmbeddedKafka, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _ingest_exactly_once(spark, sasl, tmp_path, "secured.sasl.orders")
    password = sasl.password_file("ingest").read_text().strip()
    out, err = capfd.readouterr()
    assert password not in out + err
    # Nothing the run wrote holds it: the table's data and log, the ledger, the settled markers.
    # (Spark's plans of a Kafka read never print the source's options, V1 or V2, so they are no
    # place to look for it.)
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any("_delta_log" in path.parts for path in written)
    for path in written:
        assert password.encode() not in path.read_bytes(), f"the SASL password is in {path}"
    options = dict(librdkafka_config(KafkaConnection(security=sasl.client_security("ingest")), "x"))
    assert options["sasl.password"] == password  # the client itself gets it


def test_ingest_over_mutual_tls_as_a_least_privileged_principal(spark: Any, mtls: EmbeddedKafka,
                                                                 tmp_path: Path) -> None:
    _ingest_exactly_once(spark, mtls, tmp_path, "secured.mtls.orders")


def _relay_exactly_once(cluster: EmbeddedKafka, dsn: str, tmp_path: Path) -> None:
    """The relay, as the ``relay`` principal with only its ACLs, under concurrent writers: every
    guarantee of the relay harness, read back as the super user."""
    setup = RelaySetup.create(tmp_path, dsn, cluster.bootstrap_servers)
    body = yaml.safe_load(setup.config.read_text())
    body["kafka"]["security"] = _security_yaml(cluster.client_security("relay"))
    setup.config.write_text(yaml.safe_dump(body))
    apply(_client(cluster), relay_grants(parse_config(body), "User:relay"))
    secured = dataclasses.replace(setup, client={k: v for k, v in _client(cluster).items()
                                                 if k != "bootstrap.servers"})
    committed, rolled_back = [], set()
    for seed in (16, 17):  # twice: the second run reads the position back as this principal
        writers = Writers(setup, threads=2, pause=0.01, seed=seed).start()
        time.sleep(3)
        writers.stop()
        secured.drain()
        committed += writers.committed
        rolled_back |= writers.rolled_back
    counts = assert_relayed_exactly_once(secured, committed, rolled_back)
    assert committed and counts


def test_the_relay_over_sasl_ssl_with_only_its_acls_from_postgres_over_tls(
        sasl: EmbeddedKafka, pg_tls: EmbeddedPostgres, tmp_path: Path) -> None:
    assert "sslmode=verify-full" in pg_tls.dsn and "password" not in pg_tls.dsn
    _relay_exactly_once(sasl, pg_tls.dsn, tmp_path)
    assert sasl.password_file("relay").read_text().strip() not in (tmp_path / "relay.log").read_text()


def test_the_relay_over_mutual_tls_with_only_its_acls(mtls: EmbeddedKafka, postgres_dsn: str, tmp_path: Path) -> None:
    _relay_exactly_once(mtls, postgres_dsn, tmp_path)


# -- each refused credential: one line naming the cause and the setting, within 10 s ----------


def _refused(conf: dict[str, Any], topics: tuple[str, ...] = ()) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises((KafkaAccessError, ServiceUnavailableError)) as caught:
        check_access(conf, topics)
    return str(caught.value), time.monotonic() - started


def test_a_wrong_password_or_unknown_user_is_named(sasl: EmbeddedKafka) -> None:
    for change in ({"sasl_password": SecretStr("not-it"), "sasl_password_file": None}, {"sasl_username": "ghost"}):
        message, took = _refused(_client(sasl, "ingest", **change))
        assert took < 10 and "refused the login" in message and "sasl_password" in message, message
        assert "\n" not in message


def test_an_untrusted_or_expired_certificate_is_named(sasl: EmbeddedKafka, mtls: EmbeddedKafka,
                                                      tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    from infra.tls import LocalCA

    stranger = LocalCA(other)
    stranger.issue("ingest")
    message, took = _refused(_client(sasl, "ingest", ssl_ca_location=stranger.certificate))
    assert took < 10 and "not signed by a CA this client trusts" in message and "ssl_ca_location" in message
    # mTLS: no client certificate, one from a CA the broker does not trust, an expired one.
    foreign = stranger.issue("ingest2")
    expired = mtls.ca.issue("ingest-expired", valid=-dt.timedelta(days=1), directory=tmp_path / "expired")
    for cert, key in ((None, None), (foreign.certificate, foreign.key), (expired.certificate, expired.key)):
        message, took = _refused(_client(mtls, "ingest", ssl_certificate_location=cert, ssl_key_location=key))
        assert took < 10 and ("refused the TLS client" in message or "expired" in message), message
        assert "ssl_certificate_location" in message


def test_a_missing_acl_is_named_and_nothing_is_written(spark: Any, sasl: EmbeddedKafka, tmp_path: Path) -> None:
    topic = _topic(sasl, "secured.sasl.unreadable")
    _produce(sasl, topic, transactions=2, per=5)
    message, took = _refused(_client(sasl, "ingest"), (topic,))
    assert took < 10 and "may not describe topic 'secured.sasl.unreadable'" in message, message
    config_path = tmp_path / "tidemark.yaml"
    config_path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": sasl.bootstrap_servers,
                  "security": _security_yaml(sasl.client_security("ingest"))},
        "pipelines": [{"name": "orders", "topics": [topic], "target": str(tmp_path / "orders"),
                       "schema": "id INT, note STRING"}]}))
    env = {**os.environ, "TIDEMARK_HOME": str(tmp_path / "home")}

    def ingest() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidemark.cli", "ingest", "orders", "--config",
                               str(config_path)], check=False, capture_output=True, text=True, env=env, timeout=120)

    # Not even Describe; then Describe without Read: each one line, before Spark starts.
    grants = ingest_grants(parse_config(yaml.safe_load(config_path.read_text())), "User:ingest")
    for allowed, words in (((), "may not describe topic"), (("DESCRIBE",), "may not read topic")):
        apply(_client(sasl), [dataclasses.replace(g, operations=allowed) for g in grants if allowed])
        proc = ingest()
        assert proc.returncode == 77, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "tidemark acls" in proc.stderr, proc.stderr
        assert words in proc.stderr and "'ingest'" in proc.stderr, proc.stderr
        assert not (tmp_path / "orders").exists()
    apply(_client(sasl), grants)  # granted: every committed record, once
    assert ingest().returncode == 0
    assert spark.read.format("delta").load(str(tmp_path / "orders")).count() == 10


def _revoke_read(cluster: EmbeddedKafka, topic: str, principal: str) -> None:
    """Delete ``principal``'s Read on ``topic``, and wait until the broker refuses it (ACLs propagate)."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from connectors.preflight import require_operation

    admin = AdminClient(_client(cluster))
    for future in admin.delete_acls([AclBindingFilter(
            ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{principal}", "*", AclOperation.READ,
            AclPermissionType.ALLOW)]).values():
        assert future.result(15), f"no Read ACL of {principal} on {topic} to delete"
    deadline = time.monotonic() + 15
    while True:
        try:
            require_operation(_client(cluster, principal), [topic], "READ")
        except KafkaAccessError:
            return
        assert time.monotonic() < deadline, "the broker still lets the principal read 15 s after the revoke"
        time.sleep(0.2)


def test_an_acl_revoked_during_a_run_is_named_and_the_batch_is_written_once_granted(
        spark: Any, sasl: EmbeddedKafka, tmp_path: Path) -> None:
    """Not Spark's stack trace: the refusal's one line, and the claimed batch written by the next run."""
    topic = _topic(sasl, "secured.sasl.revoked")
    _produce(sasl, topic, transactions=4, per=5)
    config = _pipeline_config(sasl, topic, tmp_path / "orders", "ingest")
    grants = ingest_grants(config, "User:ingest")
    apply(_client(sasl), grants)
    pipeline = config.pipelines[0]
    job = IngestJob(spark, config, pipeline, sasl.bootstrap_servers)
    steps: list[str] = []

    def revoke_once_claimed(step: str) -> None:
        steps.append(step)
        if step == "claimed":
            _revoke_read(sasl, topic, "ingest")  # between the claim and the write's read

    job.on_step = revoke_once_claimed
    with pytest.raises(KafkaAccessError) as refused:
        job.run_bounded()
    message = str(refused.value)
    assert "claimed" in steps and "committed" not in steps, steps
    assert topic in message and "'ingest'" in message and "tidemark acls" in message, message
    assert "\n" not in message and "at org.apache" not in message, message
    assert job.protocol.ledger.last() is not None  # the batch stays claimed
    apply(_client(sasl), grants)
    again = IngestJob(spark, config, pipeline, sasl.bootstrap_servers).run_bounded()
    assert _table_holds_the_topic(spark, sasl, topic, pipeline.target) == 20
    assert again.rows == 20


def test_postgres_refusals_are_named_and_stop_the_relay(pg_tls: EmbeddedPostgres, tmp_path: Path,
                                                        kafka_bootstrap: str) -> None:
    from infra.tls import LocalCA

    passfile = f"passfile={pg_tls.passfile}"
    stranger = LocalCA(tmp_path / "other-ca")
    stranger.issue("x")
    for dsn, words in ((pg_tls.dsn.replace(passfile, "password=not-it"), "wrong or missing password"),
                       (pg_tls.dsn.replace(str(pg_tls.ca.certificate), str(stranger.certificate)),
                        "sslrootcert=<the CA's PEM file>"),
                       (pg_tls.dsn.replace("sslmode=verify-full", "sslmode=disable"), "sslmode=verify-full")):
        started = time.monotonic()
        with pytest.raises(PostgresAccessError) as caught:
            check_postgres(dsn)
        assert time.monotonic() - started < 10 and words in str(caught.value), str(caught.value)
        assert "not-it" not in str(caught.value)
    config = tmp_path / "tidemark.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": kafka_bootstrap},
                                      "postgres": {"dsn": pg_tls.dsn.replace(passfile, "password=not-it")}}))
    proc = subprocess.run([sys.executable, "-m", "tidemark.cli", "relay", "run", "--config", str(config)],
                          check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TIDEMARK_HOME": str(tmp_path / "home")})
    assert proc.returncode == 77 and "refused the login of user 'postgres'" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "not-it" not in proc.stdout + proc.stderr



@pytest.mark.parametrize("missing", ["transactional-id", "topic-create", "topic-write"])
def test_a_relay_missing_an_acl_is_named_and_loses_nothing(sasl: EmbeddedKafka, postgres_dsn: str,
                                                             tmp_path: Path, missing: str) -> None:
    """Without its transactional.id, or without the right to create or to write its event
    topics, the relay stops within 10 s with one line (exit 77, not "fenced", not a redo
    loop), commits nothing and deletes no outbox row; granted the ACLs, it relays every
    event exactly once."""
    setup = RelaySetup.create(tmp_path, postgres_dsn, sasl.bootstrap_servers)
    body = yaml.safe_load(setup.config.read_text())
    body["kafka"]["security"] = _security_yaml(sasl.client_security("relay"))
    setup.config.write_text(yaml.safe_dump(body))
    grants = relay_grants(parse_config(body), "User:relay")
    events = [g for g in grants if g.resource == "TOPIC" and g.pattern == "PREFIXED"]
    dropped = [g for g in grants if g.resource == "TRANSACTIONAL_ID"] if missing == "transactional-id" else events
    assert len(dropped) == 1
    apply(_client(sasl), [g for g in grants if g not in dropped])
    if missing == "topic-write":  # they exist, and the relay may see them, not write them
        apply(_client(sasl), [dataclasses.replace(events[0], operations=("DESCRIBE",))])
        for aggregate in AGGREGATES:
            _topic(sasl, f"{setup.prefix}.{aggregate}")
    writers = Writers(setup, threads=1, pause=0.01, seed=16).start()
    time.sleep(1)
    writers.stop()
    rows = setup.outbox_rows()
    assert rows > 0
    started = time.monotonic()
    proc = subprocess.run(setup.argv("--idle-exit", "3"), check=False, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "TIDEMARK_HOME": str(tmp_path / "home")})
    took = time.monotonic() - started
    message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert took < 10 and "an ACL is missing" in message and "tidemark acls" in message, (took, message)
    assert {"transactional-id": "may not use transactional.id", "topic-create": "cannot create topic",
            "topic-write": "may not write topic"}[missing] in message, message
    secured = dataclasses.replace(setup, client={k: v for k, v in _client(sasl).items() if k != "bootstrap.servers"})
    assert setup.outbox_rows() == rows and secured.records() == []
    apply(_client(sasl), dropped)
    secured.drain()
    assert assert_relayed_exactly_once(secured, writers.committed, writers.rolled_back)
    assert setup.outbox_rows() == 0


def test_a_rotated_scram_password_is_read_from_its_file_by_the_next_client(sasl: EmbeddedKafka,
                                                                           tmp_path: Path) -> None:
    """The rotation docs/security.md describes: change the user's SCRAM credential on the
    cluster, then the secret file; the next client configured from the same settings logs in
    with the new password, and the old one is refused."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient(_client(sasl))

    def set_password(password: str) -> None:
        upsert = UserScramCredentialUpsertion("rotating", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                              password.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)

    secret = tmp_path / "rotating.password"
    set_password("first-password")
    secret.write_text("first-password\n")
    settings = sasl.client_security("ingest").model_copy(update={"sasl_username": "rotating",
                                                                 "sasl_password_file": secret})
    check_access(librdkafka_config(KafkaConnection(security=settings), sasl.bootstrap_servers))
    set_password("second-password")
    secret.write_text("second-password\n")
    old = settings.model_copy(update={"sasl_password_file": None, "sasl_password": SecretStr("first-password")})
    deadline = time.monotonic() + 30  # the broker applies a credential change shortly after the controller
    while True:
        try:
            check_access(librdkafka_config(KafkaConnection(security=old), sasl.bootstrap_servers))
        except KafkaAccessError as refused:
            assert "refused the login of 'rotating'" in str(refused)
            break
        assert time.monotonic() < deadline, "the old password still logs in"
        time.sleep(1)
    check_access(librdkafka_config(KafkaConnection(security=settings), sasl.bootstrap_servers))
