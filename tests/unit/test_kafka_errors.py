"""Which Kafka errors a follower waits out (connectors.kafka_errors): librdkafka's errors as
confluent-kafka raises them, wrapped or not, and the Java client's as a failed Spark job shows them."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka_errors import retriable_cause
from tidemark.errors import ServiceUnavailableError


def _wrapped(code: int) -> Exception:
    """A Tidemark error raised from a librdkafka one, as connectors.admin raises it."""
    try:
        try:
            raise KafkaException(KafkaError(code))
        except KafkaException as exc:
            raise ServiceUnavailableError("offsets of t[0] unavailable") from exc
    except ServiceUnavailableError as outer:
        return outer


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.LEADER_NOT_AVAILABLE,
                                  KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.FENCED_LEADER_EPOCH,
                                  KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT,
                                  KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_the_errors_of_a_broker_coming_back_are_waited_out(code: int) -> None:
    cause = retriable_cause(_wrapped(code))
    assert cause is not None and cause.startswith(KafkaError(code).name())


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.SASL_AUTHENTICATION_FAILED,
                                  KafkaError.INVALID_CONFIG, KafkaError.OFFSET_OUT_OF_RANGE])
def test_a_refusal_or_a_bad_request_is_not(code: int) -> None:
    assert retriable_cause(_wrapped(code)) is None


def test_a_fatal_error_is_never_waited_out() -> None:
    fatal = KafkaError(KafkaError._FENCED, fatal=True)
    assert fatal.fatal() and retriable_cause(KafkaException(fatal)) is None


def test_the_java_clients_retriable_exceptions_in_a_spark_jobs_text() -> None:
    text = ("py4j.protocol.Py4JJavaError: An error occurred while calling o123.save.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
            "Caused by: org.apache.kafka.common.errors.NotLeaderOrFollowerException: For requests intended only "
            "for the leader, this error indicates that the broker is not the current leader.\n\tat x")
    cause = retriable_cause(RuntimeError(text))
    assert cause is not None and cause.startswith("org.apache.kafka.common.errors.NotLeaderOrFollowerException")
    assert retriable_cause(RuntimeError("Caused by: org.apache.kafka.common.errors.TimeoutException: Timeout of "
                                        "60000ms expired before the position for partition t-0 could be determined"))
    assert retriable_cause(RuntimeError("org.apache.kafka.common.errors.TopicAuthorizationException: no")) is None
    assert retriable_cause(RuntimeError("java.util.concurrent.TimeoutException: a Spark timeout, not Kafka's")) is None


def test_a_leader_that_answers_offset_invalid_is_an_outage_not_an_end() -> None:
    """Seen with three brokers, the leader of a partition killed: ListOffsets answered -1001 (librdkafka's
    OFFSET_INVALID) for its LSO, which the plan read as an end before the stored one, a "recreated
    topic", and the follower stopped. It is a leader that cannot say yet: wait it out."""
    from types import SimpleNamespace

    from connectors.admin import KafkaAdmin

    def answered(offset: int) -> dict[tuple[str, int], Any]:
        return {("t", 0): SimpleNamespace(result=lambda: SimpleNamespace(offset=offset))}

    assert KafkaAdmin._bound(answered(774), ("t", 0), "LSO") == 774
    assert KafkaAdmin._bound(answered(0), ("t", 0), "log start") == 0
    with pytest.raises(ServiceUnavailableError, match=r"t\[0\].*-1001.*LSO"):
        KafkaAdmin._bound(answered(-1001), ("t", 0), "LSO")
