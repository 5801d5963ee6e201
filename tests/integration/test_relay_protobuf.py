"""``relay.format: protobuf`` on a real schema registry, PostgreSQL and Kafka.

The relay serializes each payload (its JSON) as its topic's subject's newest message, in
Confluent's framing; under SIGKILLs it stays exactly once, and Tidemark's ``format: protobuf``
ingest reads what it relayed; a payload that does not match its schema stops the relay
naming it, or sends its whole source transaction to the dead letters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.protobuf_schemas import compile_schema, message
from tests.protobuf_helpers import register
from tests.relay_harness import (
    AGGREGATES,
    RelaySetup,
    assert_invalid_payload_stops_then_dead_letters,
    assert_killed_relay_in_format_is_exactly_once_and_ingested,
)

CHANGED = 'syntax = "proto3";\npackage shop;\nmessage Changed { string key = 1; int64 seq = 2; }\n'


def _decode(value: bytes) -> dict[str, Any]:
    """A relayed value: framed for message index [0] of a registered id, then the body."""
    from google.protobuf import message_factory

    assert value[0] == 0 and value[5] == 0, value[:8]  # magic byte, then [0] written as the single byte 0
    changed = message_factory.GetMessageClass(message(compile_schema(CHANGED, "test"), None, "test"))()
    changed.ParseFromString(value[6:])
    return {"key": changed.key, "seq": changed.seq}


@pytest.fixture
def setup(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, schema_registry: str) -> RelaySetup:
    relay = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3, format="protobuf")
    for aggregate in AGGREGATES:
        register(schema_registry, f"{relay.prefix}.{aggregate}-value", CHANGED)
    return relay


@pytest.mark.slow
def test_sigkill_under_protobuf_loses_and_duplicates_nothing_and_ingest_reads_it(  # type: ignore[no-untyped-def]
        setup: RelaySetup, spark, table_root: str) -> None:
    assert_killed_relay_in_format_is_exactly_once_and_ingested(setup, spark, table_root, _decode, seed=13)


def test_a_payload_that_does_not_match_its_protobuf_schema_stops_or_goes_to_the_dead_letters(  # type: ignore[no-untyped-def]
        setup: RelaySetup) -> None:
    assert_invalid_payload_stops_then_dead_letters(setup, {"key": "agg-2", "sequence": 2}, "sequence", _decode)