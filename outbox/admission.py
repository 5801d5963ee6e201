"""Admission: which topic each event goes to, and whether Kafka can take its source transaction.

Why this is its own module: the relay may let a source transaction into a Kafka transaction
only when every event of it can be produced, because nothing of a transaction may be
half-relayed (G4) and an event Kafka refuses would fail the relay at every start (the slot
sends it again). So before anything of a transaction is produced (step 4 of
``outbox.relay``), each event is routed to its topic, a topic met for the first time is
created if missing and its size limit (the producer's ``message.max.bytes`` and the topic's
``max.message.bytes``) and partition count are learnt, and a transaction with an event
larger than its topic takes is refused whole: moved to the dead letters (``outbox.deadletter``)
or stopping the relay, as ``relay.on_oversized`` says.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from connectors.preflight import GRANT_HINT
from connectors.producer import KafkaUnavailableError
from outbox.capture import SourceTransaction
from outbox.deadletter import (
    InvalidPayloadError,
    OversizedEventError,
    RefusedTransactionError,
    acknowledged,
    dead_letter_events,
)
from outbox.outage import RegistryWaits
from outbox.payloads import InvalidPayload, PayloadEncoder
from outbox.pgoutput import format_lsn
from outbox.position import OFFSETS_TOPIC_CONFIG
from outbox.report import RelayReport
from outbox.schema import TableName
from tidemark.config import RelayConfig
from tidemark.errors import ConfigError, KafkaAccessError, TerminalError

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

#: Bytes a record adds to its key, value and headers on the wire (record and batch headers), rounded up.
RECORD_OVERHEAD = 512

#: librdkafka's default ``message.max.bytes``; the producer refuses anything larger.
PRODUCER_MESSAGE_MAX = 1_000_000

#: How often the relay reads its topics' partition counts again (librdkafka's own metadata refresh).
PARTITIONS_REFRESH_SECONDS = 300.0


def _admin_call(call: Callable[[], Any]) -> Any:
    """A metadata request; no answer is an outage (transient), not a crash."""
    try:
        return call()
    except KafkaException as exc:
        raise KafkaUnavailableError(f"Kafka metadata request failed: {exc.args[0]}") from None


class Admission:
    """The relay's topics, and what of each source transaction goes into Kafka: owned by
    :class:`outbox.relay.Relay`, which asks it at step 4 and reads :attr:`partition_counts`
    at step 5."""

    def __init__(self, config: RelayConfig, client_config: dict[str, Any], *, table: TableName,
                 dead_letters: TableName, report: RelayReport, db: Callable[[], Any],
                 encoder: PayloadEncoder | None = None, waits: RegistryWaits | None = None,
                 replication_factor: int | None = None, topic_partitions: int | None = None) -> None:
        self.config = config
        self.client_config = client_config
        self.table = table
        self.dead_letters = dead_letters
        self.report = report
        self._db = db
        """The relay's own connection to the database (``outbox.relay``)."""
        self.encoder = encoder
        """``relay.format: avro`` or ``protobuf``: how payloads become its values (``outbox.payloads``)."""
        self._waits = waits
        """The relay's wait for the schema registry, told when events of a topic were encoded (``outbox.outage``)."""
        self.replication_factor = replication_factor or config.replication_factor
        self.topic_partitions = topic_partitions or config.topic_partitions
        self._known_topics: set[str] = set()
        self._limits: dict[str, int] = {}
        self.partition_counts: dict[str, int] = {}
        """Each known topic's partition count (step 5 partitions events as librdkafka would)."""
        self._counted_at = 0.0
        self._routes: dict[bytes, str] = {}

    # -- the relay's topics ------------------------------------------------------------

    def ensure_topics(self, topics: set[str], *, compacted: bool = False, single: bool = False) -> None:
        """Create missing topics (shape from the config, else the cluster's defaults); learn each one's size limit.

        ``compacted`` (the offsets topic) and ``single`` (the manifest, read in order) get one partition.
        """
        missing = topics - self._known_topics
        if not missing:
            return
        from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

        for topic in missing:
            if not _TOPIC.match(topic):
                raise ConfigError(f"{topic!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-'); "
                                  "map its aggregate type to a valid topic under relay.routes")
        admin = AdminClient(self.client_config)
        existing = set(_admin_call(lambda: admin.list_topics(timeout=15)).topics)
        config: dict[str, str] = dict(OFFSETS_TOPIC_CONFIG) if compacted else {}
        if self.config.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.config.min_insync_replicas)
        create = [NewTopic(t, 1 if compacted or single else (self.topic_partitions or -1),
                           self.replication_factor or -1, config=config) for t in sorted(missing - existing)]
        if create:
            for topic, future in admin.create_topics(create).items():
                try:
                    future.result(30)
                    log.info("created topic %s", topic)
                except Exception as exc:  # noqa: BLE001 - a rival relay may have created it
                    if "TOPIC_ALREADY_EXISTS" in str(exc):
                        continue
                    if "AUTHORIZATION_FAILED" in str(exc):
                        raise KafkaAccessError(
                            f"cannot create topic {topic}: the relay's Kafka principal may neither see (Describe) "
                            f"nor create it: {GRANT_HINT}") from None
                    raise TerminalError(f"cannot create topic {topic}: {exc}; create it or grant CreateTopics")
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in sorted(missing)]
        for resource, future in admin.describe_configs(resources).items():
            try:
                entry = future.result(30).get("max.message.bytes")
                topic_limit = int(entry.value) if entry is not None and entry.value else PRODUCER_MESSAGE_MAX
            except Exception:  # noqa: BLE001 - no DescribeConfigs right: the producer's limit still holds
                topic_limit = PRODUCER_MESSAGE_MAX
            producer_limit = int(self.client_config.get("message.max.bytes", PRODUCER_MESSAGE_MAX))
            self._limits[resource.name] = min(topic_limit, producer_limit)
        self._count_partitions(admin, missing)
        self._known_topics |= missing

    def _count_partitions(self, admin: Any, topics: set[str]) -> None:
        """Learn how many partitions each topic has (a topic just created may take a moment to show them)."""
        deadline = time.monotonic() + 30
        while True:
            listed = _admin_call(lambda: admin.list_topics(timeout=15)).topics
            counts = {t: len(listed[t].partitions) for t in topics
                      if t in listed and listed[t].error is None and listed[t].partitions}
            self.partition_counts.update(counts)
            if len(counts) == len(topics):
                self._counted_at = time.monotonic()
                return
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"no partitions listed for {sorted(set(topics) - set(counts))} "
                                            "30 s after creating them")
            time.sleep(0.2)

    def recount_partitions(self) -> None:
        """Read the partition counts again once :data:`PARTITIONS_REFRESH_SECONDS` have passed (a topic may
        have grown: an event goes where librdkafka's partitioner would now put it)."""
        if time.monotonic() - self._counted_at > PARTITIONS_REFRESH_SECONDS:
            from confluent_kafka.admin import AdminClient

            self._count_partitions(AdminClient(self.client_config), set(self.partition_counts))

    def partitions(self, topic: str) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.client_config)
        metadata = _admin_call(lambda: admin.list_topics(topic, timeout=15)).topics.get(topic)
        return len(metadata.partitions) if metadata is not None and metadata.error is None else 0

    # -- step 4: what goes where -------------------------------------------------------

    def _topic(self, aggregatetype: bytes) -> str:
        topic = self._routes.get(aggregatetype)
        if topic is None:
            topic = self._routes[aggregatetype] = self.config.topic_for(aggregatetype.decode())
        return topic

    def routed(self, txn: SourceTransaction) -> list[str]:
        """The topic of each event of ``txn`` (routed once: step 4's checks and step 5's messages use them);
        a topic met for the first time is created if missing and its size limit learnt."""
        routes = self._routes
        topics = [routes.get(e.aggregatetype) or self._topic(e.aggregatetype) for e in txn.events]
        if not self._known_topics.issuperset(topics):
            self.ensure_topics(set(topics))
        return topics

    def _oversized(self, txn: SourceTransaction, topics: list[str]) -> tuple[bytes, str, int, int] | None:
        """The first event of ``txn`` larger than its topic takes: (event id, topic, size, limit), or None."""
        distinct = set(topics)
        header_bytes = 200 + 2 * len(str(txn.xid)) + 64 * len(distinct)  # the tidemark.* headers, generously
        if 0 < txn.size and txn.size + len(topics) * (header_bytes + RECORD_OVERHEAD) <= min(
                self._limits[t] for t in distinct):
            return None  # the whole transaction fits the smallest limit: no event can exceed it
        for e, topic in zip(txn.events, topics, strict=True):
            size = e.size + header_bytes + RECORD_OVERHEAD
            if size > self._limits[topic]:
                return e.id, topic, size, self._limits[topic]
        return None

    def admit(self, txn: SourceTransaction, topics: list[str]) -> bool:
        """Whether ``txn`` (its events bound for ``topics``) goes to Kafka (True) or to the dead letters
        (False); raises if it may do neither."""
        big = self._oversized(txn, topics)
        if big is None:
            return True
        event, topic, size, limit = big
        reason = (f"event {event.decode()} is about {size} bytes; {topic} takes at most {limit} "
                  "(the producer's message.max.bytes and the topic's max.message.bytes)")
        self._refuse(txn, reason, self.config.on_oversized, OversizedEventError,
                     "raise the limits and restart", "on_oversized")
        return False

    def _refuse(self, txn: SourceTransaction, reason: str, policy: str, error: type[RefusedTransactionError],
                remedy: str, setting: str) -> None:
        """``txn`` may not go to Kafka: return if it is (now) in the dead letters — acknowledged by an
        operator, or moved there by ``policy`` ``dead_letter`` — else raise ``error``, which stops the
        relay before anything of it is produced."""
        ids = [e.id.decode() for e in txn.events]
        with self._db().cursor() as cur:
            if acknowledged(cur, self.dead_letters, ids):
                log.warning("source transaction %d (commit LSN %s): acknowledged as dead letters (%s); skipping it",
                            txn.xid, format_lsn(txn.commit_lsn), reason)
                return
            if policy == "dead_letter":
                dead_letter_events(cur, self.table, self.dead_letters, ids, reason)
                log.error("ALERT relay %s: source transaction %d (commit LSN %s, %d events) moved to %s: %s",
                          self.config.id, txn.xid, format_lsn(txn.commit_lsn), len(ids), self.dead_letters, reason)
                return
        raise error(
            f"source transaction {txn.xid} (commit LSN {format_lsn(txn.commit_lsn)}): {reason}. Nothing of it was "
            f"produced and the position stops before it. Either {remedy}, or move the whole "
            f"transaction to {self.dead_letters} with `tidemark relay dead-letter --xid {txn.xid}` and restart "
            f"(relay.{setting}: dead_letter does that by itself)")

    def encoded(self, txn: SourceTransaction, topics: list[str]) -> SourceTransaction | None:
        """``relay.format: avro``/``protobuf``: ``txn`` with each payload encoded as its topic's value, or None if an
        event's payload does not match its schema and the transaction went to the dead letters
        (``on_invalid_payload: dead_letter``); raises :class:`InvalidPayloadError` to stop the relay.
        All of it is encoded before anything of it is produced: never half a transaction."""
        assert self.encoder is not None
        encode = self.encoder.encode
        values = []
        for e, topic in zip(txn.events, topics, strict=True):
            try:
                values.append(encode(topic, e.payload, serialized=e.serialized))
            except InvalidPayload as why:
                if self._waits is not None:
                    self._waits.answered(topics[:len(values) + 1])
                self._refuse(txn, f"event {e.id.decode()}: {why}", self.config.on_invalid_payload,
                             InvalidPayloadError, "register a schema version the payload matches and restart",
                             "on_invalid_payload")
                return None
        if self._waits is not None:
            self._waits.answered(topics)
        return SourceTransaction(txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, txn.events, txn.size,
                                 tuple(values))
