"""``relay.format: protobuf`` on a real schema registry, PostgreSQL and Kafka.

The relay serializes each payload (its JSON) as its topic's subject's newest message, in
Confluent's framing; under SIGKILLs it stays exactly once, and Tidemark's ``format: protobuf``
ingest reads what it relayed; a payload that does not match its schema stops the relay
naming it, or sends its whole source transaction to the dead letters.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from connectors.protobuf_schemas import compile_schema, message
from outbox.relay import CRASH_POINTS
from tests.protobuf_helpers import register
from tests.relay_harness import (
    AGGREGATES,
    RelaySetup,
    Writers,
    assert_invalid_payload_stops_then_dead_letters,
    assert_relayed_exactly_once,
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
    writers = Writers(setup, threads=2, late_rate=0.3, rollback_rate=0.2, pause=0.02, seed=13).start()
    time.sleep(1.0)
    for point in (CRASH_POINTS[len(CRASH_POINTS) // 2], CRASH_POINTS[-1]):
        code = setup.run(crash_at=point)
        assert code == -9, f"relay was not killed at {point} (exit {code}):\n{setup.log_tail()}"
    writers.stop()
    setup.drain()
    counts = assert_relayed_exactly_once(setup, writers.committed, writers.rolled_back, decode=_decode)
    assert counts["transactions"] > 0 and setup.outbox_rows() == 0

    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    topic = f"{setup.prefix}.order"
    config = parse_config({"pipelines": [{"name": "orders", "topics": [topic], "target": f"{table_root}/orders",
                                          "format": "protobuf"}]})
    report = IngestJob(spark, config, config.pipelines[0], setup.bootstrap).run_bounded()
    expected = {(e[1], e[2]) for t in writers.committed for e in t.events if e[3] == "order"}
    rows = {(r.key, r.seq) for r in spark.read.format("delta").load(f"{table_root}/orders").collect()}
    assert report.quarantined == 0 and rows == expected


def test_a_payload_that_does_not_match_its_protobuf_schema_stops_or_goes_to_the_dead_letters(  # type: ignore[no-untyped-def]
        setup: RelaySetup) -> None:
    assert_invalid_payload_stops_then_dead_letters(setup, {"key": "agg-2", "sequence": 2}, "sequence", _decode)