"""Plain confluent-kafka helpers for tests: write committed and aborted transactions."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Producer

from connectors.admin import KafkaAdmin
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


def settled_lsos(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> dict[int, int]:
    """Each partition's LSO once every transaction's markers are written: then it equals the high watermark.

    ``commit_transaction`` returns once the coordinator has logged the commit; the markers reach the
    partitions a moment later, and until then the LSO stops short of the committed records. Only for
    topics whose writers have all finished.
    """
    client = {"bootstrap.servers": bootstrap}
    parts = [(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + timeout
    with KafkaAdmin(client) as committed, KafkaAdmin(client, isolation="read_uncommitted") as uncommitted:
        while True:
            lsos = {p: b.stable_end for (_, p), b in committed.bounds(parts).items()}
            highs = {p: b.stable_end for (_, p), b in uncommitted.bounds(parts).items()}
            if lsos == highs:
                return lsos
            assert time.monotonic() < deadline, f"LSOs {lsos} never reached the high watermarks {highs}"
            time.sleep(0.1)
