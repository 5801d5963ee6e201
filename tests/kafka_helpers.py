"""Plain confluent-kafka helpers for tests: write committed and aborted transactions."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Producer

from connectors.topic_reader import read_to_end as read_all  # noqa: F401  (re-exported for tests)


def transactional_producer(bootstrap: str, transactional_id: str | None = None,
                           client: dict[str, Any] | None = None) -> Producer:
    """``client``: librdkafka properties besides the bootstrap servers (a secured cluster's credentials)."""
    producer = Producer({
        **(client or {}),
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
