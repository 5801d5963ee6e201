"""A relay's schemas against a registry that changes and fails under it (real registry, PostgreSQL, Kafka).

A payload field the relay's schema lacks is never serialized away: the relay asks the
registry for a newer version that has it and uses that one, or the payload is invalid and
follows ``on_invalid_payload``. A version registered while the relay runs is taken within
``relay.schema_refresh_seconds`` without a restart. A registry SIGKILLed under a running
relay is waited for, named as the registry (never as Kafka), and relaying resumes with
nothing lost or doubled.
"""

from __future__ import annotations

import io
import json
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml

from outbox import wire
from outbox.schema import add_event
from tests.avro_helpers import register
from tests.relay_harness import (
    AGGREGATES,
    RelaySetup,
    SourceTxn,
    Writers,
    assert_invalid_payload_stops_then_dead_letters,
    assert_relayed_exactly_once,
    header,
    kill_group,
)

CHANGED = {"type": "record", "name": "Changed", "fields": [{"name": "key", "type": "string"},
                                                           {"name": "seq", "type": "long"}]}
WITH_CHANNEL = {**CHANGED, "fields": [*CHANGED["fields"], {"name": "channel", "type": "string", "default": ""}]}


def _decode(value: bytes, schemas: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """(the frame's schema id, the record read with that id's schema)."""
    magic, schema_id = struct.unpack(">bI", value[:5])
    assert magic == 0, value[:8]
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(schemas[schema_id]), None)
    return schema_id, dict(record)  # type: ignore[arg-type]


def _decoder(schemas: dict[int, dict[str, Any]]) -> Callable[[bytes], dict[str, Any]]:
    return lambda value: _decode(value, schemas)[1]


@pytest.fixture
def setup(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry: str) -> RelaySetup:
    return RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="avro")


def _register_all(setup: RelaySetup, url: str, schema: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {register(url, f"{setup.prefix}.{a}-value", schema): schema for a in AGGREGATES}


def _add(setup: RelaySetup, aggregate: str, payload: dict[str, Any]) -> str:
    with setup.connect() as conn, conn.cursor() as cur:
        event = str(add_event(cur, aggregate, str(payload.get("key", "agg-1")), "Changed", payload, table=setup.table))
        conn.commit()
    return event


def _until(what: Callable[[], bool], relay: Any, setup: RelaySetup, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert relay.poll() is None, f"relay exited {relay.returncode}:\n{setup.log_tail()}"
        assert time.monotonic() < deadline, f"timed out:\n{setup.log_tail()}"
        time.sleep(0.5)


def test_a_field_no_version_has_stops_the_relay_or_goes_to_the_dead_letters(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str) -> None:
    schemas = _register_all(setup, schema_registry, CHANGED)
    assert_invalid_payload_stops_then_dead_letters(setup, {"key": "agg-2", "seq": 1, "channel": "web"}, "channel",
                                                   _decoder(schemas))


def test_a_misspelt_field_is_refused_not_dropped(setup: RelaySetup, schema_registry: str) -> None:
    """``chanel`` for ``channel``, whose default would otherwise fill the value in silently."""
    _register_all(setup, schema_registry, WITH_CHANNEL)
    good = _add(setup, "order", {"key": "agg-1", "seq": 1, "channel": "web"})
    bad = _add(setup, "order", {"key": "agg-1", "seq": 2, "chanel": "web"})
    assert setup.run("--idle-exit", "3") == 1, setup.log_tail()
    log = setup.log_tail()
    assert f"event {bad}" in log and f"{setup.prefix}.order-value" in log and "'chanel'" in log, log
    assert [header(r, wire.EVENT_ID) for r in setup.records()] == [good]
    assert setup.outbox_rows() == 1


def test_a_version_registered_while_the_relay_runs_carries_a_new_field_without_a_restart(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str) -> None:
    """The payload with the new field arrives within the refresh interval (default 60 s: the
    relay asks on the miss)."""
    subject = f"{setup.prefix}.order-value"
    v1 = register(schema_registry, subject, CHANGED)
    relay = setup.start()
    try:
        _add(setup, "order", {"key": "agg-1", "seq": 1})
        _until(lambda: len(setup.records()) == 1, relay, setup)
        v2 = register(schema_registry, subject, WITH_CHANNEL)
        assert v2 != v1
        _add(setup, "order", {"key": "agg-1", "seq": 2, "channel": "web"})
        _until(lambda: len(setup.records()) == 2, relay, setup)
        assert relay.poll() is None, setup.log_tail()
    finally:
        relay.terminate()
        relay.wait(60)
    schemas = {v1: CHANGED, v2: WITH_CHANNEL}
    assert [_decode(r.value or b"", schemas) for r in setup.records()] == [
        (v1, {"key": "agg-1", "seq": 1}), (v2, {"key": "agg-1", "seq": 2, "channel": "web"})]


def test_a_relay_takes_a_new_version_within_schema_refresh_seconds(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str) -> None:
    """Payloads without the new field too are framed with the newest version once the relay has
    looked again, so consumers see the version the application writes for."""
    subject = f"{setup.prefix}.order-value"
    v1 = register(schema_registry, subject, CHANGED)
    refreshing = setup.with_relay("refresh.yaml", schema_refresh_seconds=2)
    relay = refreshing.start()
    try:
        _add(setup, "order", {"key": "agg-1", "seq": 1})
        _until(lambda: len(setup.records()) == 1, relay, setup)
        v2 = register(schema_registry, subject, WITH_CHANNEL)
        time.sleep(4)
        _add(setup, "order", {"key": "agg-1", "seq": 2})
        _until(lambda: len(setup.records()) == 2, relay, setup)
    finally:
        relay.terminate()
        relay.wait(60)
    schemas = {v1: CHANGED, v2: WITH_CHANNEL}
    assert [_decode(r.value or b"", schemas) for r in setup.records()] == [
        (v1, {"key": "agg-1", "seq": 1}), (v2, {"key": "agg-1", "seq": 2, "channel": ""})]


PROTO_V1 = 'syntax = "proto3";\npackage shop;\nmessage Changed { string key = 1; int64 seq = 2; }\n'
PROTO_V2 = ('syntax = "proto3";\npackage shop;\n'
            'message Changed { string key = 1; int64 seq = 2; string channel = 3; }\n')


def test_a_protobuf_relay_takes_a_version_registered_while_it_runs(  # type: ignore[no-untyped-def]
        tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry: str) -> None:
    """Protobuf's JSON mapping already refuses a field the message lacks; the newer version that has
    it is what the relay asks for before refusing."""
    from google.protobuf import message_factory

    from connectors.protobuf_schemas import compile_schema, message
    from tests.protobuf_helpers import register as register_proto

    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="protobuf")
    subject = f"{setup.prefix}.order-value"
    v1 = register_proto(schema_registry, subject, PROTO_V1)
    relay = setup.start()
    try:
        _add(setup, "order", {"key": "agg-1", "seq": 1})
        _until(lambda: len(setup.records()) == 1, relay, setup)
        v2 = register_proto(schema_registry, subject, PROTO_V2)
        _add(setup, "order", {"key": "agg-1", "seq": 2, "channel": "web"})
        _until(lambda: len(setup.records()) == 2, relay, setup)
    finally:
        relay.terminate()
        relay.wait(60)
    ids = [struct.unpack(">bI", (r.value or b"")[:5])[1] for r in setup.records()]
    assert ids == [v1, v2]
    changed = message_factory.GetMessageClass(message(compile_schema(PROTO_V2, "test"), None, "test"))()
    changed.ParseFromString((setup.records()[1].value or b"")[6:])
    assert (changed.key, changed.seq, changed.channel) == ("agg-1", 2, "web")


def _keyed_transaction(setup: RelaySetup, aggregate: str, key: str) -> SourceTxn:
    """One event of ``key`` on ``aggregate``'s topic, its seq taken as :class:`Writers` take theirs."""
    with setup.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        xid = int(cur.fetchone()[0])
        cur.execute(f"UPDATE {setup.keys_table} SET seq = seq + 1 WHERE key = %s RETURNING seq", (key,))
        seq = int(cur.fetchone()[0])
        event = add_event(cur, aggregate, key, "Changed", {"key": key, "seq": seq}, table=setup.table)
        conn.commit()
    return SourceTxn(xid, [(str(event), key, seq, aggregate)])


def _registry_status(setup: RelaySetup) -> str:
    """The ``schema registry`` line of ``relay status`` for ``setup``'s relay."""
    from outbox.status import relay_status
    from tidemark.config import parse_config

    config = parse_config(yaml.safe_load(setup.config.read_text()))
    return relay_status(config.relay, dsn=setup.dsn, client_config={"bootstrap.servers": setup.bootstrap},
                        registry=config.schema_registry)["schema registry"]


@pytest.mark.slow
def test_a_registry_killed_under_a_running_relay_is_waited_for_and_named(  # type: ignore[no-untyped-def]
        tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, settings) -> None:
    """The registry SIGKILLed while writers go on; a topic the relay meets for the first time then
    needs it. The relay waits (one line naming the registry and the subject, never Kafka), and
    resumes once it answers again (started again on its data: ids kept)."""
    from infra.registry import EmbeddedRegistry
    from tests.stack_fixtures import free_port_block

    registry = EmbeddedRegistry(tmp_path / "registry", settings.home_dir, port=free_port_block(2, start=28400),
                                java=settings.registry.java)
    url = registry.start()
    relay = None
    try:
        setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="avro",
                                  schema_refresh_seconds=3)
        config = yaml.safe_load(setup.config.read_text())
        config["schema_registry"] = {"url": url}
        setup.config.write_text(yaml.safe_dump(config))
        schemas = _register_all(setup, url, CHANGED)
        late = f"{setup.prefix}.refund-value"
        schemas[register(url, late, CHANGED)] = CHANGED

        relay = setup.start()
        writers = Writers(setup, threads=2, pause=0.05, seed=21).start()
        _until(lambda: len({r.topic for r in setup.records()}) == len(AGGREGATES), relay, setup)  # all looked up

        process = registry.pidfile.process()
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        time.sleep(4)  # the relay's schema refresh meets a registry that does not answer
        refund = _keyed_transaction(setup, "refund", "agg-3")
        time.sleep(12)
        writers.stop()
        log = (tmp_path / "relay.log").read_text(errors="replace")
        assert relay.poll() is None, log[-3000:]
        assert "Kafka unavailable" not in log, log[-3000:]
        named = [line for line in log.splitlines() if url in line and repr(late) in line]
        assert named and "does not answer" in named[0], log[-3000:]
        assert "waiting" in log and "answers again" not in log, log[-3000:]
        assert setup.outbox_rows() > 0  # the refund and what came after wait
        assert "does not answer" in _registry_status(setup)

        registry.start()
        assert _registry_status(setup) == f"{url} answers"
        setup.catch_up_and_stop(relay)
        log = (tmp_path / "relay.log").read_text(errors="replace")
        assert "answers again" in log and log.count("schema registry unavailable") == 1, log[-3000:]
        report = json.loads(next(line for line in reversed(log.splitlines()) if line.startswith("{")))
        assert report["outages"] == 0, report
        assert_relayed_exactly_once(setup, [*writers.committed, refund], writers.rolled_back,
                                    decode=_decoder(schemas))
    finally:
        if relay is not None and relay.poll() is None:
            kill_group(relay)
        registry.stop()
