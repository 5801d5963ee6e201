"""The secured stack's schema registry: HTTPS only and basic authentication (real Apicurio).

What the secured embedded stack runs when ``TIDEMARK_KAFKA__SECURITY`` is set: a client without
the password, with a wrong one, or without the CA gets one clear error (the last not a wait
that never ends); the password is in no command line, environment or log; and an Avro
ingest and the relay's encoder work through it with the settings the stack hands them.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.error
import urllib.request
from pathlib import Path

import fastavro
import pytest

from tests.avro_helpers import framed
from tests.integration.test_avro import V1, _produce

pytestmark = pytest.mark.slow


def test_the_secured_registry_takes_only_authenticated_tls_clients_and_serves_ingest_and_relay(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, table_root: str, settings, tmp_path: Path) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from connectors.registry import Registry, client_config
    from infra.registry import USER, EmbeddedRegistry
    from outbox.avro import AvroEncoder
    from pipelines.ingest import IngestJob
    from tests.stack_fixtures import free_port_block
    from tidemark.config import SchemaRegistryConfig, parse_config
    from tidemark.errors import AccessDeniedError, ConfigError

    registry = EmbeddedRegistry(tmp_path / "registry", settings.home_dir, port=free_port_block(2, start=28300),
                                java=settings.registry.java, secured=True)
    url = registry.start()
    try:
        assert url.startswith("https://")
        password = registry.password_file.read_text()
        given = {"url": url, "basic_auth_username": USER, "basic_auth_password_file": str(registry.password_file),
                 "ssl_ca_location": str(registry.ca.certificate)}
        good = SchemaRegistryConfig(**given)

        with pytest.raises(AccessDeniedError, match="HTTP 401"):
            Registry(SchemaRegistryConfig(**{**given, "basic_auth_password_file": None,
                                             "basic_auth_password": "wrong"}), settings).versions("x")
        with pytest.raises(AccessDeniedError, match="HTTP 401"):
            Registry(SchemaRegistryConfig(url=url, ssl_ca_location=registry.ca.certificate), settings).versions("x")
        with pytest.raises(ConfigError, match="does not trust .*ssl_ca_location"):
            Registry(SchemaRegistryConfig(**{**given, "ssl_ca_location": None}), settings).versions("x")
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP listener
            urllib.request.urlopen(url.replace("https://", "http://") + "/subjects", timeout=5).read()

        process = registry.pidfile.process()
        assert process is not None
        assert password not in " ".join(process.cmdline())
        assert password not in json.dumps(process.environ())

        topic = topic_factory("avro-secured")
        client = SchemaRegistryClient(client_config(good, url))
        v1 = int(client.register_schema(f"{topic}-value", Schema(json.dumps(V1), "AVRO")))
        _produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": i, "note": None}) for i in range(4)])
        config = parse_config({"schema_registry": given, "pipelines": [
            {"name": "orders", "topics": [topic], "target": f"{table_root}/orders", "format": "avro"}]})
        report = IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded()
        assert (report.rows, report.quarantined) == (4, 0)

        value = AvroEncoder(good, settings).encode(topic, b'{"id": 7, "note": "relayed"}')
        assert value is not None and struct.unpack(">bI", value[:5]) == (0, v1)
        assert fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(V1), None) == {
            "id": 7, "note": "relayed"}
    finally:
        registry.stop()
    assert password not in registry.log.read_text(errors="replace")
