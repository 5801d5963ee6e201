"""Pure logic of the ingest core: range planning and config validation."""

from __future__ import annotations

import pytest

from connectors.admin import PartitionBounds, RetentionLossError
from offsets.ledger import Intent, OffsetRegressionError, Range, batch_of_commit, now_utc
from offsets.planner import plan_ranges
from tidemark.config import parse_config
from tidemark.errors import ConfigError, TerminalError


def B(low: int, lso: int) -> PartitionBounds:
    return PartitionBounds(low, lso)


def test_ranges_start_where_the_last_batch_ended_and_stop_at_the_lso() -> None:
    ranges = plan_ranges({("t", 0): 10}, {("t", 0): B(0, 30)}, {}, 1000)
    assert ranges == (Range("t", 0, 10, 30),)


def test_new_partitions_start_at_the_start_policy() -> None:
    ranges = plan_ranges({("t", 0): 10}, {("t", 0): B(0, 10), ("t", 1): B(4, 9)}, {("t", 1): 4}, 1000)
    assert ranges == (Range("t", 0, 10, 10), Range("t", 1, 4, 9))


def test_the_cap_is_shared_fairly_and_never_exceeded() -> None:
    bounds = {("t", 0): B(0, 1000), ("t", 1): B(0, 3), ("t", 2): B(0, 1000)}
    ranges = plan_ranges({}, bounds, {tp: 0 for tp in bounds}, 101)
    spans = {r.partition: r.span for r in ranges}
    assert spans[1] == 3 and sum(spans.values()) == 101 and abs(spans[0] - spans[2]) <= 1


def test_the_byte_cap_sizes_each_partition_by_its_bytes_per_offset() -> None:
    bounds = {("t", 0): B(0, 1000), ("t", 1): B(0, 1000), ("t", 2): B(0, 1000)}
    weight = {("t", 0): 10.0, ("t", 1): 1000.0, ("t", 2): 0.0}  # t[2]: markers only, weighs nothing
    ranges = plan_ranges({}, bounds, {tp: 0 for tp in bounds}, 3000, max_bytes=20_000, bytes_per_offset=weight)
    spans = {r.partition: r.span for r in ranges}
    assert spans[2] == 1000  # free: only the record cap applies
    assert sum(spans[p] * weight[("t", p)] for p in (0, 1)) <= 20_000
    # Fair in bytes: the light partition takes its whole lag (10 kB), the heavy one the rest.
    assert spans[0] == 1000 and spans[1] == 10


def test_the_tighter_of_the_two_caps_wins() -> None:
    bounds = {("t", 0): B(0, 1000)}
    w = {("t", 0): 100.0}
    assert plan_ranges({}, bounds, {("t", 0): 0}, 50, max_bytes=1_000_000, bytes_per_offset=w)[0].span == 50
    assert plan_ranges({}, bounds, {("t", 0): 0}, 1000, max_bytes=1_050, bytes_per_offset=w)[0].span == 10
    assert plan_ranges({}, bounds, {("t", 0): 0}, 1000)[0].span == 1000  # no byte cap: records only


def test_a_record_larger_than_the_byte_cap_still_moves_alone() -> None:
    bounds = {("t", 0): B(0, 5), ("t", 1): B(0, 5)}
    w = {("t", 0): 5_000.0, ("t", 1): 9_000.0}
    ranges = plan_ranges({}, bounds, {tp: 0 for tp in bounds}, 100, max_bytes=1_000, bytes_per_offset=w)
    assert sorted(r.span for r in ranges) == [0, 1]


def test_a_start_below_the_log_start_is_retention_loss_not_a_skip() -> None:
    with pytest.raises(RetentionLossError) as info:
        plan_ranges({("t", 0): 5}, {("t", 0): B(20, 40)}, {}, 100)
    assert info.value.losses == {("t", 0): (5, 20)}
    assert "t[0] wanted 5 but the log starts at 20" in str(info.value)
    assert isinstance(info.value, TerminalError)


def test_a_caught_up_partition_with_expired_history_is_not_loss() -> None:
    # Everything up to 50 was read; retention then deleted it all: nothing is lost.
    assert plan_ranges({("t", 0): 50}, {("t", 0): B(50, 50)}, {}, 100) == (Range("t", 0, 50, 50),)


def test_offsets_never_move_backwards() -> None:
    with pytest.raises(OffsetRegressionError, match="deleted and recreated"):
        plan_ranges({("t", 0): 500}, {("t", 0): B(0, 10)}, {}, 100)
    with pytest.raises(OffsetRegressionError, match="no longer exist"):
        plan_ranges({("gone", 0): 5}, {("t", 0): B(0, 10)}, {("t", 0): 0}, 100)


def test_commit_metadata_round_trips_and_ignores_other_pipelines() -> None:
    intent = Intent("orders", 7, "w", now_utc(), (Range("t", 0, 1, 9), Range("t", 1, 3, 3)))
    meta = intent.to_json()
    assert batch_of_commit(meta, "orders") == 7
    assert batch_of_commit(meta, "payments") is None
    assert batch_of_commit("written by someone else", "orders") is None
    assert batch_of_commit(None, "orders") is None


def _pipeline(**fields: object) -> dict[str, object]:
    return {"name": "orders", "topics": ["o"], "target": "/t", "schema": "id INT", **fields}


def test_a_valid_config_has_derived_paths() -> None:
    p = parse_config({"pipelines": [_pipeline()]}).pipelines[0]
    assert (p.quarantine_path, p.ledger_path) == ("/t_quarantine", "/t_tidemark_ledger")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start": "soon"}, "pipelines[0].start: expected 'earliest', 'latest' or {timestamp:"),
        ({"name": "Orders"}, "pipelines[0].name: use lower-case letters"),
        ({"topic_pattern": "o.*"}, "give exactly one of `topics`"),
        ({"format": "json", "schema": None}, "format json needs `schema`"),
        ({"start": {"timestamp": "2026-01-01T00:00:00"}}, "give a time zone"),
        ({"max_records_per_batch": 0}, "pipelines[0].max_records_per_batch"),
        ({"colour": "blue"}, "pipelines[0].colour"),
    ],
)
def test_bad_config_names_the_field_and_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"pipelines": [_pipeline(**fields)]})
    assert message in str(info.value)


def test_sasl_needs_credentials_and_the_password_stays_secret() -> None:
    with pytest.raises(ConfigError, match="needs sasl_mechanism, sasl_username, sasl_password"):
        parse_config({"kafka": {"security": {"protocol": "SASL_SSL"}}})
    cfg = parse_config({"kafka": {"security": {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                               "sasl_username": "u", "sasl_password": "s3cret"}}})
    assert "s3cret" not in repr(cfg)
    from connectors.kafka_config import librdkafka_config, spark_options

    assert librdkafka_config(cfg.kafka, "b:9092")["sasl.password"] == "s3cret"
    jaas = spark_options(cfg.kafka, "b:9092")["kafka.sasl.jaas.config"]
    assert jaas == 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret";'


def test_duplicate_pipeline_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="repeated: orders"):
        parse_config({"pipelines": [_pipeline(), _pipeline()]})


def test_backfill_arguments_parse_or_say_what_to_write() -> None:
    from pipelines.backfill import parse_batches, parse_offsets
    from tidemark.errors import ConfigError

    assert parse_batches("7") == (7, 7) and parse_batches("3-7") == (3, 7)
    for bad in ("0", "7-3", "a", "3-x"):
        with pytest.raises(ConfigError, match="--batches"):
            parse_batches(bad)
    assert parse_offsets("orders:0=120, my:topic:1=88") == {("orders", 0): 120, ("my:topic", 1): 88}
    for bad in ("orders=1", "orders:x=1", "orders:0", ""):
        with pytest.raises(ConfigError, match="TOPIC:PARTITION=OFFSET"):
            parse_offsets(bad)
