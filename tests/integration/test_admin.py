"""What ``connectors.admin`` reads from a real broker: log starts, LSOs, high watermarks, times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.admin import KafkaAdmin
from tests.kafka_helpers import transactional_producer
from tidemark.errors import ServiceUnavailableError, TerminalError


def test_bounds_are_the_log_start_and_the_lso_below_an_open_transaction(kafka_bootstrap: str,  # type: ignore[no-untyped-def]
                                                                        topic_factory) -> None:
    topic = topic_factory("admin", partitions=2)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        plain.produce(topic, value=b"x", partition=0, timestamp=1_000_000 + i * 1000)
    plain.produce(topic, value=b"x", partition=1, timestamp=1_000_000)
    plain.flush(30)
    client = {"bootstrap.servers": kafka_bootstrap}
    deleter = AdminClient(client)  # alive until the futures complete
    for future in deleter.delete_records([TopicPartition(topic, 0, 2)]).values():
        future.result(30)
    open_txn = transactional_producer(kafka_bootstrap)
    open_txn.begin_transaction()
    for _ in range(3):
        open_txn.produce(topic, value=b"y", partition=1)
    open_txn.flush(30)
    try:
        with KafkaAdmin(client) as admin:
            parts = admin.partitions_matching([topic])
            assert parts == [(topic, 0), (topic, 1)]
            committed = admin.bounds(parts)
            assert [(b.log_start, b.stable_end) for b in committed.values()] == [(2, 5), (0, 1)]
            # The first record at or after 1,003,000 ms is offset 3; nothing that late in partition 1: its LSO.
            at = admin.offsets_for_time(parts, datetime.fromtimestamp(1003, UTC))
            assert at == {(topic, 0): 3, (topic, 1): 1}
        with KafkaAdmin(client, isolation="read_uncommitted") as admin:
            assert admin.bounds([(topic, 1)])[(topic, 1)].stable_end == 4  # the high watermark
    finally:
        open_txn.abort_transaction(30)


def test_a_missing_topic_or_partition_is_an_error_that_says_which(kafka_bootstrap: str,  # type: ignore[no-untyped-def]
                                                                  topic_factory) -> None:
    topic = topic_factory("admin")
    with KafkaAdmin({"bootstrap.servers": kafka_bootstrap}, timeout=5) as admin:
        assert admin.partitions_matching(pattern=f"{topic}|no-such-topic") == [(topic, 0)]
        with pytest.raises(TerminalError, match="no-such-topic-x"):
            admin.partitions_matching([topic, "no-such-topic-x"])
        with pytest.raises(ServiceUnavailableError, match=rf"{topic}\[7\]"):
            admin.bounds([(topic, 7)])
    with pytest.raises(ValueError, match="isolation"):
        KafkaAdmin({"bootstrap.servers": kafka_bootstrap}, isolation="committed")
