"""Which Kafka errors are worth waiting out: one classification for every client Tidemark uses.

A broker that restarts, or a partition whose leadership moves, answers for a while with
errors that say "not now" rather than "never": a leader epoch newer than the broker's, no
leader yet, a coordinator still loading, a request that timed out. Kafka marks these
retriable (``org.apache.kafka.common.errors.RetriableException`` in Java, ``retriable()``
in librdkafka), and a follower that stopped on one would stop ingestion for good without a
supervisor. They reach Tidemark two ways: from librdkafka (confluent-kafka's
``KafkaException`` carrying a ``KafkaError``, possibly wrapped in a Tidemark error), and
from Spark's Kafka reader as Java exception names in a Py4J error's text. Both are read
here; a refusal (an ACL, a password) is never retriable and is told apart elsewhere
(:func:`connectors.preflight.spark_refusal`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: librdkafka's codes for Kafka's retriable errors and its own transient states, by name (some
#: client versions lack some names): a code alone decides where ``retriable()`` is not set.
RETRIABLE_CODES = (
    "UNKNOWN_LEADER_EPOCH", "NOT_LEADER_FOR_PARTITION", "NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "COORDINATOR_LOAD_IN_PROGRESS",
    "NOT_COORDINATOR", "NOT_COORDINATOR_FOR_GROUP", "COORDINATOR_NOT_AVAILABLE", "GROUP_COORDINATOR_NOT_AVAILABLE",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NETWORK_EXCEPTION", "KAFKA_STORAGE_ERROR",
    "REPLICA_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART", "CONCURRENT_TRANSACTIONS", "PREFERRED_LEADER_NOT_AVAILABLE",
    "THROTTLING_QUOTA_EXCEEDED", "_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT",
    "_WAIT_COORD",
)

#: Kafka's Java client exceptions that extend ``RetriableException`` (as Spark's Kafka reader raises them).
JAVA_RETRIABLE = (
    "NotLeaderOrFollowerException", "NotLeaderForPartitionException", "LeaderNotAvailableException",
    "UnknownLeaderEpochException", "FencedLeaderEpochException", "OffsetNotAvailableException",
    "CoordinatorLoadInProgressException", "NotCoordinatorException", "CoordinatorNotAvailableException",
    "NotEnoughReplicasException", "NotEnoughReplicasAfterAppendException", "NetworkException",
    "DisconnectException", "KafkaStorageException", "UnknownTopicOrPartitionException",
    "ReplicaNotAvailableException", "org.apache.kafka.common.errors.TimeoutException",
)

#: A bare name of :data:`JAVA_RETRIABLE` is Kafka's own; a qualified one only with its package
#: (``TimeoutException`` alone names several other libraries' exceptions).
_JAVA = re.compile("|".join(re.escape(name) if "." in name else rf"(?:org\.apache\.kafka\.common\.errors\.)?{name}"
                            for name in JAVA_RETRIABLE) + r"\b[^\n]*")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, name) for name in RETRIABLE_CODES if hasattr(KafkaError, name))


def retriable_cause(exc: BaseException) -> str | None:
    """The retriable Kafka error behind ``exc`` (one line), or None if it holds none.

    librdkafka's own mark (``retriable()``, ``txn_requires_abort()``) or a code of
    :data:`RETRIABLE_CODES` anywhere in the exception's chain; or, for a failed Spark job,
    one of :data:`JAVA_RETRIABLE` in its text. A fatal librdkafka error is never retriable.
    """
    from confluent_kafka import KafkaError, KafkaException

    codes = _codes()
    for cause in _chain(exc):
        error = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
        if isinstance(error, KafkaError):
            if error.fatal():
                return None
            if error.retriable() or error.txn_requires_abort() or error.code() in codes:
                return f"{error.name()}: {error.str()}"
    found = _JAVA.search(str(exc))
    return found.group(0)[:300] if found else None
