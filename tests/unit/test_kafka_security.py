"""Kafka security settings and the ACLs derived from a config: pure logic, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.acls import ingest_grants, relay_grants
from connectors.kafka_config import librdkafka_config, spark_options
from tidemark.config import KafkaConnection, KafkaSecurity, parse_config
from tidemark.errors import ConfigError


def _sasl(**extra: object) -> KafkaSecurity:
    return KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="relay", **extra)


def test_the_password_comes_from_a_file_or_the_environment_read_at_use(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    conf = librdkafka_config(KafkaConnection(security=_sasl(sasl_password_file=secret)), "b:1")
    assert conf["sasl.password"] == "from-file"
    secret.write_text("rotated")
    assert librdkafka_config(KafkaConnection(security=_sasl(sasl_password_file=secret)), "b:1")[
        "sasl.password"] == "rotated"
    monkeypatch.setenv("KAFKA_PW", 'p"w\\x')
    options = spark_options(KafkaConnection(security=_sasl(sasl_password_env="KAFKA_PW")), "b:1")
    assert 'password="p\\"w\\\\x";' in options["kafka.sasl.jaas.config"]
    monkeypatch.delenv("KAFKA_PW")
    with pytest.raises(ConfigError, match="KAFKA_PW, which is not set"):
        librdkafka_config(KafkaConnection(security=_sasl(sasl_password_env="KAFKA_PW")), "b:1")
    with pytest.raises(ConfigError, match="cannot read"):
        librdkafka_config(KafkaConnection(security=_sasl(sasl_password_file=tmp_path / "none")), "b:1")


def test_security_settings_that_cannot_work_are_refused_with_the_fix() -> None:
    for bad, words in (({"kafka": {"security": {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                                 "sasl_username": "u"}}}, "needs sasl_password"),
                       ({"kafka": {"security": {"protocol": "SSL", "ssl_certificate_location": "/c"}}},
                        "both ssl_certificate_location and ssl_key_location"),
                       ({"kafka": {"security": {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                                "sasl_username": "u", "sasl_password": "x",
                                                "sasl_password_env": "X"}}}, "not several")):
        with pytest.raises(ConfigError, match=words):
            parse_config(bad)
    assert "hunter2" not in repr(_sasl(sasl_password="hunter2"))


def test_a_missing_ca_file_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    sec = _sasl(sasl_password="x", ssl_ca_location=tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="kafka.security.ssl_ca_location"):
        librdkafka_config(KafkaConnection(security=sec), "b:1")
    conf = librdkafka_config(KafkaConnection(security=_sasl(sasl_password="x", ssl_verify_hostname=False)), "b:1")
    assert conf["ssl.endpoint.identification.algorithm"] == "none"


def test_acls_follow_the_config() -> None:
    config = parse_config({
        "relay": {"id": "shop", "topic": "shop.{aggregatetype}", "routes": {"audit": "audit-log"}},
        "pipelines": [{"name": "a", "topics": ["shop.order"], "target": "/t/a", "schema": "id INT"},
                      {"name": "b", "topic_pattern": r"^shop\.pay.*", "target": "/t/b", "schema": "id INT"}]})
    relay = {(g.resource, g.name, g.pattern): g.operations for g in relay_grants(config, "User:relay")}
    assert relay[("TOPIC", "shop.", "PREFIXED")] == ("WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS")
    assert ("TOPIC", "audit-log", "LITERAL") in relay
    assert relay[("TRANSACTIONAL_ID", "tidemark-relay-shop", "LITERAL")] == ("WRITE", "DESCRIBE")
    ingest = {(g.resource, g.name, g.pattern): g.operations for g in ingest_grants(config, "User:ingest")}
    assert ingest[("TOPIC", "shop.order", "LITERAL")] == ("READ", "DESCRIBE")
    assert ("TOPIC", "shop.pay", "PREFIXED") in ingest
    assert ingest[("TOPIC", "tidemark.relay-manifest", "LITERAL")] == ("READ", "DESCRIBE")
    assert not any(op == "WRITE" for ops in ingest.values() for op in ops)
    line = relay_grants(config, "User:relay")[2].command("k:9093")
    assert "--transactional-id 'tidemark-relay-shop'" in line and "--operation Write" in line
    with pytest.raises(ConfigError, match="no literal prefix"):
        ingest_grants(parse_config({"pipelines": [{"name": "c", "topic_pattern": ".*", "target": "/t/c",
                                                    "schema": "id INT"}]}), "User:i")


def test_each_component_may_name_its_own_principal(tmp_path: Path) -> None:
    from connectors.acls import principal_of
    from infra.tls import LocalCA

    pem = LocalCA(tmp_path / "ca").issue("shop-ingest")
    shared = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "ops",
              "sasl_password_env": "OPS_PW"}
    config = parse_config({
        "kafka": {"bootstrap_servers": "b:1", "security": shared},
        "relay": {"kafka_security": {**shared, "sasl_username": "shop-relay"}},
        "pipelines": [{"name": "a", "topics": ["t"], "target": "/t/a", "schema": "id INT",
                       "kafka_security": {"protocol": "SSL", "ssl_certificate_location": str(pem.certificate),
                                          "ssl_key_location": str(pem.key)}},
                      {"name": "b", "topics": ["u"], "target": "/t/b", "schema": "id INT"}]})
    assert config.for_relay().kafka.security.sasl_username == "shop-relay"
    assert config.for_pipeline("a").kafka.security.protocol == "SSL"
    assert config.for_pipeline("b").kafka.security.sasl_username == "ops"  # no own credentials: the shared ones
    assert principal_of(config.relay.kafka_security, "relay") == "shop-relay"
    assert principal_of(config.pipeline("a").kafka_security, "ingest") == "shop-ingest"
    assert principal_of(config.pipeline("b").kafka_security, "ingest") == "ingest"


def test_spark_gets_the_client_key_in_a_keystore_java_17_opens_and_never_in_clear(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Java 17 cannot read a PBES2-encrypted PKCS#8 key (what openssl and cryptography write), so an
    encrypted key goes into a PKCS#12 keystore under the same password; a plain one into a PEM file."""
    from cryptography.hazmat.primitives.serialization import pkcs12

    from infra.tls import LocalCA
    from tidemark.settings import settings

    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    settings.cache_clear()
    try:
        ca = LocalCA(tmp_path / "ca")
        for password in ("s3cret-key", None):
            pem = ca.issue("ingest", directory=tmp_path / f"client-{password}", key_password=password)
            sec = KafkaSecurity(protocol="SSL", ssl_certificate_location=pem.certificate, ssl_key_location=pem.key,
                                ssl_ca_location=ca.certificate, ssl_key_password=password)
            options = spark_options(KafkaConnection(security=sec), "b:1")
            store = Path(options["kafka.ssl.keystore.location"])
            assert store.is_relative_to(tmp_path / "home") and store.stat().st_mode & 0o077 == 0
            if password:
                assert options["kafka.ssl.keystore.type"] == "PKCS12"
                assert options["kafka.ssl.keystore.password"] == options["kafka.ssl.key.password"] == password
                key, cert, _ = pkcs12.load_key_and_certificates(store.read_bytes(), password.encode())
                assert key is not None and cert is not None and b"PRIVATE KEY" not in store.read_bytes()
                with pytest.raises(ValueError):
                    pkcs12.load_key_and_certificates(store.read_bytes(), b"not-it")
            else:
                assert options["kafka.ssl.keystore.type"] == "PEM" and "kafka.ssl.key.password" not in options
                assert b"BEGIN PRIVATE KEY" in store.read_bytes() and b"BEGIN CERTIFICATE" in store.read_bytes()
        wrong = KafkaSecurity(protocol="SSL", ssl_certificate_location=pem.certificate,
                              ssl_key_location=tmp_path / "client-s3cret-key" / "ingest.key",
                              ssl_key_password="not-it")
        with pytest.raises(ConfigError, match="ssl_key_password"):
            spark_options(KafkaConnection(security=wrong), "b:1")
    finally:
        settings.cache_clear()


def test_the_readers_group_id_is_stable_per_options_and_says_nothing_of_the_credentials() -> None:
    """Spark pools consumers by group id: one id per set of options (so a batch reuses the last
    batch's consumers), a new one when a credential changes (so none keeps an old password)."""
    from pipelines.transform import reader_group

    old = spark_options(KafkaConnection(security=_sasl(sasl_password="old-secret")), "b:1")
    new = spark_options(KafkaConnection(security=_sasl(sasl_password="new-secret")), "b:1")
    assert reader_group(old) == reader_group(dict(reversed(list(old.items()))))
    assert reader_group(old) != reader_group(new)
    assert "secret" not in reader_group(old) and reader_group(old).startswith("tidemark-read-")


def test_a_refused_consumer_group_is_named_and_other_errors_are_not() -> None:
    from confluent_kafka import KafkaError

    from connectors.preflight import group_refused

    refused = group_refused(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), {"sasl.username": "relay"})
    assert refused is not None and "'relay'" in str(refused) and "tidemark acls" in str(refused)
    assert refused.exit_code == 77
    assert group_refused(KafkaError(KafkaError._PARTITION_EOF), {}) is None


def test_a_refusal_inside_a_spark_job_becomes_its_one_line_and_other_failures_do_not() -> None:
    from connectors.preflight import spark_refusal

    conf = {"bootstrap.servers": "b:1", "sasl.username": "ingest"}
    trace = ("An error occurred while calling o419.save.\n: org.apache.spark.SparkException: Job aborted\n"
             "Caused by: org.apache.kafka.common.errors.{}\n\tat org.apache.kafka.clients.Fetcher")
    cases = {
        "TopicAuthorizationException: Not authorized to access topics: [orders, payments]":
            ("reading orders, payments", "tidemark acls"),
        "GroupAuthorizationException: Not authorized to access group: tidemark-reader-1":
            ("consumer group", "tidemark acls"),
        "SaslAuthenticationException: Authentication failed during authentication due to invalid credentials":
            ("login of 'ingest'", "sasl_password"),
        "SslAuthenticationException: SSL handshake failed": ("TLS client", "ssl_certificate_location"),
    }
    for cause, words in cases.items():
        refusal = spark_refusal(RuntimeError(trace.format(cause)), conf)
        assert refusal is not None and refusal.exit_code == 77, cause
        text = str(refusal)
        assert all(w in text for w in words) and "\n" not in text and "org.apache" not in text, text
        assert "next run writes it" in text, text
    assert spark_refusal(RuntimeError(trace.format("TimeoutException: Timeout of 60000ms expired")), conf) is None
    assert spark_refusal(ValueError("bad"), conf) is None


def test_the_secured_stack_hands_its_registry_to_a_config_that_names_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``TIDEMARK_KAFKA__SECURITY`` set, the embedded registry is served over HTTPS with basic
    authentication, and a config without ``schema_registry.url`` gets its URL, CA and password file."""
    from orchestration.context import with_stack_security
    from tidemark.config import TidemarkConfig
    from tidemark.settings import settings

    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIDEMARK_KAFKA__SECURITY", "sasl_ssl")
    monkeypatch.setenv("TIDEMARK_REGISTRY__ENABLED", "true")
    monkeypatch.setenv("TIDEMARK_REGISTRY__PORT", "18555")
    settings.cache_clear()
    try:
        registry = with_stack_security(TidemarkConfig()).schema_registry
        assert registry.url == "https://127.0.0.1:18555/apis/ccompat/v7"
        assert registry.basic_auth_username == "tidemark" and registry.basic_auth_password_file is not None
        assert registry.basic_auth_password_file.stat().st_mode & 0o077 == 0
        assert registry.password() == registry.basic_auth_password_file.read_text()
        assert registry.ssl_ca_location is not None and registry.ssl_ca_location.is_relative_to(tmp_path / "home")
        named = TidemarkConfig(schema_registry={"url": "https://registry.example.com"})  # type: ignore[arg-type]
        assert with_stack_security(named).schema_registry == named.schema_registry  # the user's own: untouched
    finally:
        settings.cache_clear()
