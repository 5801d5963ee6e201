"""The transactional producer on a real broker: after a disturbance, a new epoch before the next transaction.

librdkafka keeps one producer epoch across transactions (no KIP-890 v2), so a late
request of a past transaction could join the next one. The producer replaces its
instance after any error event; the new instance's ``init_transactions()`` bumps the
epoch, which fences the old one. The real trigger (a broker SIGKILLed under the relay)
is exercised by the slow ``test_relay_crash.py``; here the error event is delivered the
way librdkafka delivers it, through the ``error_cb``; the caller (the relay) renews.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.producer import KafkaUnavailableError, TransactionalProducer
from tests.kafka_helpers import read_all


def _last_epoch(stats: list[dict[str, object]]) -> tuple[int, int]:
    """(producer id, epoch) of the newest statistics report that has one."""
    known = [(int(s["producer_id"]), int(s["producer_epoch"])) for s in stats  # type: ignore[call-overload]
             if int(s.get("producer_epoch", -1)) >= 0]  # type: ignore[call-overload]
    assert known, "no statistics report named a producer epoch"
    return known[-1]


def test_an_error_event_renews_the_producer_and_fences_the_old_instance(kafka_bootstrap: str,
                                                                        topic_factory) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("renew", partitions=1)
    stats: list[dict[str, object]] = []
    lock = threading.Lock()

    def on_stats(raw: str) -> None:
        eos = json.loads(raw).get("eos", {})
        with lock:
            stats.append(eos)

    producer = TransactionalProducer({
        "bootstrap.servers": kafka_bootstrap, "transactional.id": f"test-renew-{uuid.uuid4().hex[:8]}",
        "statistics.interval.ms": 100, "stats_cb": on_stats})
    producer.init()
    producer.run(lambda p: p.produce(topic, key=b"k", value=b"first"), what="first")
    producer._producer.poll(0.3)  # let a stats report arrive
    with lock:
        pid, epoch = _last_epoch(stats)
        stats.clear()
    old = producer._producer

    producer._on_error(KafkaError(KafkaError._TRANSPORT))  # what librdkafka reports when a connection drops
    assert producer.disturbed == "client error event _TRANSPORT"
    producer.renew()
    assert producer.disturbed is None
    producer.run(lambda p: p.produce(topic, key=b"k", value=b"second"), what="second")
    assert producer.renewals == 1 and producer._producer is not old
    producer._producer.poll(0.3)
    with lock:
        pid2, epoch2 = _last_epoch(stats)
    assert (pid2 == pid and epoch2 > epoch) or pid2 != pid, f"no epoch bump: {(pid, epoch)} -> {(pid2, epoch2)}"

    producer._on_error(KafkaError(KafkaError._FENCED, fatal=True))
    assert producer.disturbed is None  # fenced is fatal: the next call raises it, no renewal
    producer.run(lambda p: p.produce(topic, key=b"k", value=b"third"), what="third")
    assert [r.value for r in read_all(kafka_bootstrap, topic)] == [b"first", b"second", b"third"]
    producer.close()


def test_a_renewal_fences_what_the_old_instance_left_open(kafka_bootstrap: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    """What the renewal buys: a record the old instance got to the broker in a transaction it
    never finished (a late request, as far as the broker can tell) is aborted, never joined
    to the next transaction."""
    topic = topic_factory("renew-fence", partitions=1)
    producer = TransactionalProducer({"bootstrap.servers": kafka_bootstrap,
                                      "transactional.id": f"test-renew-fence-{uuid.uuid4().hex[:8]}"})
    producer.init()
    old = producer._producer
    old.begin_transaction()
    old.produce(topic, value=b"late")
    old.flush(10)  # on the broker, in an open transaction of the current epoch
    producer._on_error(KafkaError(KafkaError._TRANSPORT))
    producer.renew()
    producer.run(lambda p: p.produce(topic, key=None, value=b"next"), what="next")
    assert producer.renewals == 1
    assert [r.value for r in read_all(kafka_bootstrap, topic)] == [b"next"]
    assert [r.value for r in read_all(kafka_bootstrap, topic, isolation="read_uncommitted")] == [b"late", b"next"]
    producer.close()


def test_close_destroys_the_instance_even_after_a_failed_fence(kafka_bootstrap: str) -> None:
    """A relay session that ends in an outage closes its producer; an instance left alive keeps
    asking for its producer id and, once the broker is back, fences the relay's next instance
    (what the slow broker-restart test in ``test_relay_crash.py`` caught). Closing destroys it."""
    producer = TransactionalProducer({"bootstrap.servers": kafka_bootstrap,
                                      "transactional.id": f"test-close-{uuid.uuid4().hex[:8]}"}, retry_for=0)
    try:
        producer.init(timeout=0.001)  # gives up at once, while librdkafka goes on in the background
    except KafkaUnavailableError:
        pass
    instance = producer._producer
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        instance.poll(0)


def test_fenced_while_delivery_reports_are_served_is_a_fence(kafka_bootstrap: str,
                                                             topic_factory) -> None:  # type: ignore[no-untyped-def]
    """Fenced mid-transaction with delivery callbacks pending: the caller gets the fence (exit 3),
    not the ``SystemError`` confluent-kafka raises when it calls a callback after the fatal error."""
    from functools import partial

    topic = topic_factory("fenced-reports", partitions=3)
    tid = f"fenced-reports-{uuid.uuid4().hex[:8]}"
    seen: list[object] = []

    def delivered(index: int, err: object, msg: object) -> None:
        seen.append(err)

    def body(p: TransactionalProducer) -> None:
        p.produce_all((topic, i % 3, b"k", b"v", None, partial(delivered, i)) for i in range(200))
        p.flush(30)

    _fenced_within(kafka_bootstrap, tid, body)


def test_a_produce_refused_after_a_fence_is_a_fence(kafka_bootstrap: str,
                                                    topic_factory) -> None:  # type: ignore[no-untyped-def]
    """Once the instance knows it is fenced, ``produce()`` answers librdkafka's generic ``_FATAL``
    ("Unable to produce message"); the caller must still get the fence (exit 3), not a fatal error."""
    topic = topic_factory("fenced-produce", partitions=1)
    tid = f"fenced-produce-{uuid.uuid4().hex[:8]}"
    reports: list[object] = []

    def body(p: TransactionalProducer) -> None:
        p.produce(topic, key=b"k", value=b"first", on_delivery=lambda err, msg: reports.append(err))
        deadline = time.monotonic() + 30
        known = False
        while not (reports or known) and time.monotonic() < deadline:  # the fence arrives as a failed delivery
            try:
                p.serve()
            except KafkaException:
                known = True
            time.sleep(0.05)
        assert reports or known, "the fence never reached the instance, so the produce below proves nothing"
        p.produce(topic, key=b"k", value=b"after the fence")

    _fenced_within(kafka_bootstrap, tid, body)


def _fenced_within(kafka_bootstrap: str, tid: str, body: Callable[[TransactionalProducer], None]) -> None:
    """Run ``body`` in a transaction of an instance that a second one fences as the body starts:
    the caller must get the fence (exit 3), whatever the body was doing when it arrived."""
    from connectors.producer import ProducerFencedError

    first = TransactionalProducer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid}, retry_for=10)
    first.init(30)
    second = TransactionalProducer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid}, retry_for=10)

    def fenced_then_body(p: TransactionalProducer) -> None:
        second.init(30)  # fences ``first`` before any of its records reach the broker
        body(p)

    try:
        with pytest.raises(ProducerFencedError):
            first.run(fenced_then_body, what="a fenced transaction", timeout=10)
    finally:
        first.close(5)
        second.close(5)
