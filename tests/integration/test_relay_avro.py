"""``relay.format: avro`` on a real schema registry, PostgreSQL and Kafka.

The relay serializes each payload with its topic's subject, in Confluent's framing; under
SIGKILLs it stays exactly once; a payload that does not match its schema stops the relay
naming it, or sends its whole source transaction to the dead letters; and Tidemark's
``format: avro`` ingest reads what it relayed. A schema file is used only once registered,
by the operator or by ``auto_register``; a ``bytea`` payload passes unchanged.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest

from outbox import wire
from outbox.schema import add_event
from tests.avro_helpers import framed, register
from tests.relay_harness import (
    AGGREGATES,
    RelaySetup,
    assert_invalid_payload_stops_then_dead_letters,
    assert_killed_relay_in_format_is_exactly_once_and_ingested,
    header,
)

CHANGED = {"type": "record", "name": "Changed", "fields": [{"name": "key", "type": "string"},
                                                           {"name": "seq", "type": "long"}]}


def _decoder(ids: dict[int, dict[str, Any]]):  # type: ignore[no-untyped-def]
    parsed = {i: fastavro.parse_schema(s) for i, s in ids.items()}

    def decode(value: bytes) -> dict[str, Any]:
        magic, schema_id = struct.unpack(">bI", value[:5])
        assert magic == 0, value[:8]
        return dict(fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed[schema_id], None))

    return decode


@pytest.fixture
def setup(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry: str) -> RelaySetup:
    return RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="avro")


def _register_all(setup: RelaySetup, url: str) -> dict[int, dict[str, Any]]:
    return {register(url, f"{setup.prefix}.{a}-value", CHANGED): CHANGED for a in AGGREGATES}


@pytest.mark.slow
def test_sigkill_under_avro_loses_and_duplicates_nothing_and_ingest_reads_it(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str, spark, table_root: str) -> None:
    ids = _register_all(setup, schema_registry)
    assert_killed_relay_in_format_is_exactly_once_and_ingested(setup, spark, table_root, _decoder(ids), seed=11)


def test_a_payload_that_does_not_match_stops_the_relay_or_goes_to_the_dead_letters(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str) -> None:
    ids = _register_all(setup, schema_registry)
    assert_invalid_payload_stops_then_dead_letters(setup, {"key": "agg-2", "seq": "two"}, "seq", _decoder(ids))


def _latest(url: str, subject: str) -> dict[str, Any]:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return json.loads(SchemaRegistryClient({"url": url}).get_latest_version(subject).schema.schema_str)


def test_a_schema_file_is_used_once_registered_and_auto_register_registers_only_compatible_ones(  # type: ignore[no-untyped-def]
        setup: RelaySetup, schema_registry: str) -> None:
    topic = f"{setup.prefix}.order"
    schema = {**CHANGED, "fields": [*CHANGED["fields"], {"name": "note", "type": "string", "default": ""}]}
    path = setup.tmp / "order.avsc"
    path.write_text(json.dumps(schema))
    with setup.connect() as conn, conn.cursor() as cur:
        first = str(add_event(cur, "order", "agg-1", "Changed", {"key": "agg-1", "seq": 1}, table=setup.table))
        conn.commit()

    ahead = setup.with_relay("ahead.yaml", schemas={topic: str(path)})
    assert ahead.run("--idle-exit", "3") == 78, ahead.log_tail()
    assert str(path) in ahead.log_tail() and "auto_register" in ahead.log_tail()
    assert setup.records() == [] and setup.outbox_rows() == 1

    auto = setup.with_relay("auto.yaml", schemas={topic: str(path)}, auto_register=True)
    assert auto.run("--idle-exit", "3") == 0, auto.log_tail()
    assert _latest(schema_registry, f"{topic}-value") == schema
    (record,) = setup.records()
    assert header(record, wire.EVENT_ID) == first
    schema_id = struct.unpack(">bI", (record.value or b"")[:5])[1]
    assert _decoder({schema_id: schema})(record.value or b"") == {"key": "agg-1", "seq": 1, "note": ""}

    # seq long -> string breaks BACKWARD: the registry refuses it, the relay stops and names the file.
    path.write_text(json.dumps({**CHANGED, "fields": [{"name": "key", "type": "string"},
                                                      {"name": "seq", "type": "string"}]}))
    with setup.connect() as conn, conn.cursor() as cur:
        add_event(cur, "order", "agg-1", "Changed", {"key": "agg-1", "seq": "2"}, table=setup.table)
        conn.commit()
    assert auto.run("--idle-exit", "3") == 78, auto.log_tail()
    assert "refuses" in auto.log_tail() and str(path) in auto.log_tail()
    assert len(setup.records()) == 1 and _latest(schema_registry, f"{topic}-value") == schema


def test_a_bytea_payload_passes_unchanged_and_an_unframed_one_follows_the_policy(  # type: ignore[no-untyped-def]
        tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry: str) -> None:
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="avro",
                              payload_column="bytea")
    schema_id = register(schema_registry, f"{setup.prefix}.order-value", CHANGED)
    values = [framed(schema_id, CHANGED, {"key": f"agg-{i}", "seq": i}) for i in range(3)]
    with setup.connect() as conn, conn.cursor() as cur:
        good = [str(add_event(cur, "order", "agg-1", "Changed", v, table=setup.table)) for v in values]
        conn.commit()
        bad = str(add_event(cur, "order", "agg-2", "Changed", b'{"key": "agg-2"}', table=setup.table))
        conn.commit()
    assert setup.run("--idle-exit", "3") == 1, setup.log_tail()
    assert f"event {bad}" in setup.log_tail() and "framing" in setup.log_tail()
    records = setup.records()
    assert [header(r, wire.EVENT_ID) for r in records] == good and [r.value for r in records] == values

    dead = setup.with_relay("dead.yaml", on_invalid_payload="dead_letter")
    assert dead.run("--idle-exit", "3") == 0, dead.log_tail()
    assert len(setup.records()) == 3 and setup.outbox_rows() == 0
