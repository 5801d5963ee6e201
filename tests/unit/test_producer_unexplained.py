"""A ``SystemError`` with no Kafka error inside a transaction (a confluent-kafka quirk when an
instance turns fatal while serving delivery reports) is settled by the instance's own state.
Pure logic: librdkafka's two answers are played by a stand-in, since the quirk cannot be
provoked on demand; the fence it stands for is tested on a real broker in test_producer.py."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.producer import ProducerFencedError, TransactionAbortedError, TransactionalProducer


class _Instance:
    def __init__(self, abort_error: KafkaError | None) -> None:
        self.abort_error = abort_error
        self.aborted = 0

    def flush(self, timeout: float) -> int:
        raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting an exception")

    def abort_transaction(self, timeout: float) -> None:
        self.aborted += 1
        if self.abort_error is not None:
            raise KafkaException(self.abort_error)

    def poll(self, timeout: float) -> int:
        return 0


def _producer(instance: Any) -> TransactionalProducer:
    producer = TransactionalProducer({"bootstrap.servers": "127.0.0.1:9", "transactional.id": "unit-quirk"})
    producer._producer.close()
    producer._producer = instance
    return producer


def test_a_fenced_instance_behind_the_quirk_is_a_fence() -> None:
    instance = _Instance(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    with pytest.raises(ProducerFencedError, match="fenced"):
        _producer(instance).within(lambda p: p.flush(5), what="relaying")
    assert instance.aborted == 1


def test_a_healthy_instance_behind_the_quirk_aborts_for_a_redo_and_is_renewed_next() -> None:
    instance = _Instance(None)
    producer = _producer(instance)
    with pytest.raises(TransactionAbortedError, match="aborted to be redone"):
        producer.within(lambda p: p.flush(5), what="relaying")
    assert instance.aborted == 1 and producer.disturbed is not None
