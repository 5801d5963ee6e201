"""Pure logic: settings parsing, error markers, jar names, start-up preconditions."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra import jars
from infra.process import ephemeral_ports, free_port, free_port_block, java_executable, require_free_ports
from tidemark import errors
from tidemark.settings import load_settings


def test_defaults_use_the_embedded_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TIDEMARK_KAFKA__BOOTSTRAP_SERVERS", "TIDEMARK_POSTGRES__DSN"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert s.kafka.bootstrap_servers is None and s.postgres.dsn is None


def test_env_points_at_existing_servers_and_hides_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMARK_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("TIDEMARK_POSTGRES__DSN", "host=db user=app password=hunter2")
    s = load_settings()
    assert s.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert s.postgres.dsn is not None and s.postgres.dsn.get_secret_value().endswith("hunter2")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.kafka.port = 1  # type: ignore[misc]


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMARK_KAFKA__BROKERS", "2x")
    with pytest.raises(errors.ConfigError) as info:
        load_settings()
    assert "TIDEMARK_KAFKA__BROKERS" in str(info.value)
    assert info.value.exit_code == 78


def test_error_markers_decide_retry() -> None:
    assert issubclass(errors.ServiceUnavailableError, errors.TransientError)
    for terminal in (errors.ConfigError, errors.PortInUseError, errors.JarsMissingError, errors.MissingToolError):
        assert issubclass(terminal, errors.TerminalError)
        assert not issubclass(terminal, errors.TransientError)
    assert issubclass(errors.TransientError, errors.TidemarkError)


def test_taken_port_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(errors.PortInUseError) as info:
            require_free_ports({"kafka client": port}, "TIDEMARK_KAFKA__PORT")
    assert f"kafka client {port}" in str(info.value) and "TIDEMARK_KAFKA__PORT" in str(info.value)


def test_test_servers_never_listen_where_outgoing_connections_take_their_ports() -> None:
    """A block that would reach into the ephemeral range is passed over (a client connecting
    anywhere could take one of its ports before the server binds: CI saw a broker fail so)."""
    ephemeral = ephemeral_ports()
    start = free_port_block(6, start=ephemeral.start - 3)
    assert not set(range(start, start + 6)) & set(ephemeral)
    assert start > ephemeral[-1] or start + 6 <= ephemeral.start
    assert free_port() not in ephemeral


def test_missing_java_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(errors.MissingToolError, match="openjdk-17"):
        java_executable()


def test_missing_jars_say_how_to_fetch_them(tmp_path: Path) -> None:
    with pytest.raises(errors.JarsMissingError, match="make bootstrap"):
        jars.cached(tmp_path, "kafka")


@pytest.mark.parametrize(
    ("file", "artifact", "version"),
    [
        ("spark-sql-kafka-0-10_2.13-4.1.3.jar", "spark-sql-kafka-0-10_2.13", "4.1.3"),
        ("spark-token-provider-kafka-0-10_2.13-4.1.0-preview1.jar", "spark-token-provider-kafka-0-10_2.13",
         "4.1.0-preview1"),
        ("delta-spark_4.1_2.13-4.4.0.jar", "delta-spark_4.1_2.13", "4.4.0"),
        ("zstd-jni-1.5.6-10.jar", "zstd-jni", "1.5.6-10"),
        ("kafka_2.13-4.3.1.jar", "kafka_2.13", "4.3.1"),
    ],
)
def test_jar_file_names_parse(file: str, artifact: str, version: str) -> None:
    m = jars._VERSIONED_JAR.match(file)
    assert m is not None and (m["artifact"], m["version"]) == (artifact, version)


def test_kafka_cluster_ids_never_look_like_an_option() -> None:
    from infra.kafka import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]  # about 78 would start with '-' without the redraw
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids) and len(set(ids)) == len(ids)


def test_json_log_lines_are_one_object_each() -> None:
    import json
    import logging

    from tidemark.cli.main import JsonFormatter

    record = logging.LogRecord("outbox.relay", logging.INFO, __file__, 1, "relayed txid %d: %d events", (7, 3), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line) | {"ts": "-"} == {"ts": "-", "level": "INFO", "logger": "outbox.relay",
                                              "msg": "relayed txid 7: 3 events"}


def test_an_internal_error_prints_one_line_and_logs_the_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    crash = "import sys, tidemark.cli.stack, tidemark.cli.main\ntidemark.cli.stack.cmd_stack_status = lambda a: 1 / 0\nsys.exit(tidemark.cli.main.main(['stack', 'status']))"
    done = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "TIDEMARK_HOME": str(tmp_path)})
    log_file = tmp_path / "logs" / "tidemark.log"
    assert done.returncode == 70
    assert done.stderr.splitlines()[0] == "tidemark: internal error: ZeroDivisionError: division by zero"
    assert f"the traceback is in {log_file}" in done.stderr and "Traceback" not in done.stderr
    assert "ZeroDivisionError" in log_file.read_text() and "Traceback (most recent call last)" in log_file.read_text()


@pytest.mark.parametrize(("status", "error"), [
    (503, "RegistryUnavailableError"), (429, "RegistryUnavailableError"), (408, "RegistryUnavailableError"),
    (401, "AccessDeniedError"), (422, "ConfigError"), (400, "ConfigError"),
])
def test_a_registry_refusal_waits_only_when_asking_again_can_help(status: int, error: str) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from connectors.registry import Registry
    from tidemark.config import SchemaRegistryConfig
    from tidemark.settings import Settings

    registry = Registry(SchemaRegistryConfig(url="http://127.0.0.1:9"), Settings())

    def refused() -> None:
        raise SchemaRegistryError(status, status * 100, "refused")

    with pytest.raises(Exception) as raised:
        registry._ask("the versions of subject 's'", refused)
    assert type(raised.value).__name__ == error, raised.value
    assert registry._ask("a lookup", lambda: (_ for _ in ()).throw(SchemaRegistryError(404, 40401, "no"))) is None
