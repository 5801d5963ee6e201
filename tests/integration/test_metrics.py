"""The Prometheus endpoint, scraped over HTTP while a real `ingest --follow` and a real relay run."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.process import free_port
from tests.ingest_harness import ingest_argv, process_env, write_config
from tests.kafka_helpers import settled_lsos, transactional_producer, write_transaction
from tests.relay_harness import RelaySetup

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(port: int) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _until(port: int, proc: subprocess.Popen[bytes], done: Callable[[Samples], bool], log: Path,
           timeout: float = 180) -> Samples:
    """Scrape until ``done`` holds; the process must stay up meanwhile."""
    deadline = time.monotonic() + timeout
    samples: Samples = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
        try:
            samples = _scrape(port)
        except OSError:
            samples = {}  # not listening yet
        if samples and done(samples):
            return samples
        time.sleep(0.5)
    pytest.fail(f"metrics never matched; last scrape: {sorted(samples.items())[:40]}")


def _partitions_match(samples: Samples, topic: str, lsos: dict[int, int]) -> bool:
    return all(_value(samples, "tidemark_partition_committed_offset", pipeline="orders", topic=topic,
                      partition=str(p)) == lso
               and _value(samples, "tidemark_partition_lso_offset", pipeline="orders", topic=topic,
                          partition=str(p)) == lso
               and _value(samples, "tidemark_partition_lag_offsets", pipeline="orders", topic=topic,
                          partition=str(p)) == 0 for p, lso in lsos.items())


def test_ingest_follow_metrics_match_kafka(kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("metrics", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(4):
        write_transaction(producer, topic, [json.dumps({"id": t * 10 + i, "note": "x"}).encode() for i in range(5)],
                          commit=t != 1)
    config = write_config(tmp_path / "tidemark.yaml", kafka_bootstrap, tmp_path / "orders", topics=[topic],
                          trigger_interval_seconds=0.5)
    port = free_port()
    log = tmp_path / "ingest.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(ingest_argv(config, "--follow", "--metrics-port", str(port)), env=process_env(),
                                stdout=out, stderr=out, start_new_session=True)
    try:
        # Before the first batch the endpoint already answers: the backlog shows as lag, nothing committed.
        early = _until(port, proc, lambda s: _value(s, "tidemark_partition_lso_offset", pipeline="orders",
                                                    topic=topic, partition="0") is not None, log)
        if _value(early, "tidemark_batches_total", pipeline="orders") in (None, 0.0):
            assert sum(v for (name, _), v in early.items() if name == "tidemark_partition_lag_offsets") > 0

        lsos = settled_lsos(kafka_bootstrap, topic, 2)
        first = _until(port, proc, lambda s: _partitions_match(s, topic, lsos)
                       and _value(s, "tidemark_batch_rows_total", pipeline="orders") == 15, log)
        batches = _value(first, "tidemark_batches_total", pipeline="orders")
        assert batches is not None and batches >= 1
        assert _value(first, "tidemark_batch_duration_seconds_count", pipeline="orders") == batches
        assert _value(first, "tidemark_quarantined_rows_total", pipeline="orders") == 0
        # Offsets cover the aborted transaction and every marker too, exactly what the partitions hold.
        assert _value(first, "tidemark_batch_offsets_total", pipeline="orders") == sum(lsos.values())

        for t in range(2):
            write_transaction(producer, topic, [json.dumps({"id": 100 + t * 10 + i}).encode() for i in range(5)],
                              commit=True)
        lsos = settled_lsos(kafka_bootstrap, topic, 2)
        _until(port, proc, lambda s: _partitions_match(s, topic, lsos)
               and _value(s, "tidemark_batch_rows_total", pipeline="orders") == 25, log)
    finally:
        proc.terminate()
        assert proc.wait(120) == 0, log.read_text(errors="replace")[-3000:]


def test_relay_metrics_match_the_outbox_and_kafka(tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str) -> None:
    setup = RelaySetup.create(tmp_path, postgres_dsn, kafka_bootstrap, ack_every=3)
    with setup.connect() as conn, conn.cursor() as cur:
        for t in range(6):
            cur.execute(f"INSERT INTO {setup.table} (id, aggregatetype, aggregateid, type, payload) "
                        "SELECT gen_random_uuid(), 'order', 'k' || i, 'Changed', '{}'::jsonb "
                        "FROM generate_series(1, 4) i")
            conn.commit()
    port = free_port()
    relay = setup.start("--metrics-port", str(port))
    try:
        done = _until(port, relay, lambda s: _value(s, "tidemark_relay_events_total", relay=setup.relay_id) == 24
                      and _value(s, "tidemark_relay_lag_events", relay=setup.relay_id) == 0, tmp_path / "relay.log")
        assert setup.outbox_rows() == 0 and len(setup.records()) == 24  # what the endpoint says, Kafka and PG say
        assert _value(done, "tidemark_relay_source_transactions_total", relay=setup.relay_id) == 6
        kafka_txns = _value(done, "tidemark_relay_kafka_transactions_total", relay=setup.relay_id)
        assert kafka_txns is not None and 1 <= kafka_txns <= 6  # grouped, never split
        assert _value(done, "tidemark_relay_lag_seconds", relay=setup.relay_id) == 0
        position = _value(done, "tidemark_relay_position_lsn", relay=setup.relay_id)
        assert position is not None and position > 0
    finally:
        relay.terminate()
        assert relay.wait(60) == 0, setup.log_tail()
