"""Read a whole topic, partition by partition, up to the end the broker reports.

Under ``read_committed`` the end is the last stable offset; partition EOF (not a poll
timeout) says a partition is done, so ranges made of transaction markers or aborted
records cost nothing. It reconciles what Kafka holds against a table, by the demo
and by tests; the ingest path reads through Spark instead.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tidemark.errors import ServiceUnavailableError


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def _headers(raw: object) -> tuple[tuple[str, bytes], ...]:
    pairs = raw.items() if isinstance(raw, dict) else (raw or [])
    return tuple((str(k), v.encode() if isinstance(v, str) else bytes(v or b"")) for k, v in pairs)  # type: ignore[attr-defined]


def read_to_end(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60,
    extra: dict[str, str] | None = None,
) -> list[Record]:
    """Every visible record of ``topic``, from each partition's start to its current end."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"tidemark-reader-{uuid.uuid4().hex[:8]}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        **(extra or {}),
    })
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = set(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"partitions {sorted(pending)} of {topic} did not reach their end within {timeout:.0f}s"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise ServiceUnavailableError(f"reading {topic}: {err}")
            records.append(Record(topic, int(msg.partition() or 0), int(msg.offset() or 0), msg.key(), msg.value(),
                                  _headers(msg.headers())))
        return records
    finally:
        consumer.close()
