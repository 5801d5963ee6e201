"""``relay.format: avro``: an event's ``jsonb`` payload as Avro, in Confluent's framing.

Each topic's values are serialized with the newest version of its subject (``<topic>-value``,
Confluent's TopicNameStrategy) in the schema registry, by confluent-kafka's ``AvroSerializer``,
which frames them (magic byte 0, the schema's id, the body) as every Confluent deserializer
and Tidemark's ``format: avro`` ingest expect. Schemas are registered ahead: a JSON payload
names no schema, so nothing is registered from here. The serializer of a topic looks its
subject's newest version up once and keeps it (a relay restarted after a new version is
registered takes the new one).

What step 4 (``outbox.admission``) needs from here: the encoded values of a source
transaction's events, or why one cannot be encoded — a payload that does not match its
schema (:class:`InvalidPayload`, for the relay's ``on_invalid_payload`` policy), a subject
with no version (terminal: register it), a registry that does not answer (transient: the
relay stops with exit 75 before producing the transaction; its open Kafka transaction is
aborted and the slot sends everything unconfirmed again when it is run again).
"""

from __future__ import annotations

import json
from typing import Any

from connectors.registry import client_config, registry_url
from tidemark.config import SchemaRegistryConfig
from tidemark.errors import ConfigError, RegistryUnavailableError
from tidemark.settings import Settings


class InvalidPayload(Exception):
    """This event's payload cannot be serialized with its subject's schema (the reason says why)."""


class PayloadEncoder:
    def __init__(self, config: SchemaRegistryConfig, settings: Settings) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = registry_url(config, settings)
        self._client = SchemaRegistryClient(client_config(config, self.url))
        self._serializers: dict[str, Any] = {}

    def _serializer(self, topic: str) -> Any:
        serializer = self._serializers.get(topic)
        if serializer is None:
            from confluent_kafka.schema_registry.avro import AvroSerializer

            serializer = AvroSerializer(self._client, None,
                                        conf={"auto.register.schemas": False, "use.latest.version": True})
            self._serializers[topic] = serializer
        return serializer

    def encode(self, topic: str, payload: bytes | None) -> bytes | None:
        """The payload as its topic's Avro value (None stays None: a tombstone)."""
        if payload is None:
            return None
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext

        try:
            record = json.loads(payload)
        except ValueError as exc:  # jsonb is always valid JSON; kept for a payload from elsewhere
            raise InvalidPayload(f"the payload is not JSON ({exc})") from None
        try:
            return bytes(self._serializer(topic)(record, SerializationContext(topic, MessageField.VALUE)))
        except SchemaRegistryError as exc:
            subject = f"{topic}-value"
            if exc.http_status_code == 404:
                raise ConfigError(f"relay.format avro: subject {subject!r} has no schema in the registry at "
                                  f"{self.url}; register the topic's schema there, then start the relay again"
                                  ) from None
            raise RegistryUnavailableError(f"the schema registry at {self.url} failed looking up {subject!r} "
                                           f"(HTTP {exc.http_status_code}); run the relay again once it answers") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # fastavro's refusals of the record
            raise InvalidPayload(f"the payload does not match the schema of {topic}-value: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - httpx's and the OS's connection failures
            if "Serializ" in type(exc).__name__:
                raise InvalidPayload(f"the payload does not match the schema of {topic}-value: {exc}") from None
            raise RegistryUnavailableError(f"the schema registry at {self.url} does not answer "
                                           f"({type(exc).__name__}: {exc}); run the relay again once it answers") from None
