"""Plain confluent-kafka helpers for tests: write transactions, read a topic to its end."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def transactional_producer(bootstrap: str, transactional_id: str | None = None) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id or f"test-{uuid.uuid4().hex[:8]}",
        "enable.idempotence": True,
        "linger.ms": 5,
    })
    producer.init_transactions(30)
    return producer


def write_transaction(producer: Producer, topic: str, values: list[bytes], *, commit: bool,
                      partition: int | None = None) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(topic, value=value, key=str(i).encode(), **kwargs)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def read_all(bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 30) -> list[Record]:
    """Every record of ``topic`` from the beginning up to the end each partition reports."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"reader-{uuid.uuid4().hex[:8]}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = set(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"partitions {sorted(pending)} of {topic} never reached EOF")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise RuntimeError(msg.error())
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value()))
        return records
    finally:
        consumer.close()
