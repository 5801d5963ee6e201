"""``relay.format: avro``: an event's ``jsonb`` payload as Avro, in Confluent's framing.

Each topic's values are serialized with the newest version of its subject (``<topic>-value``,
Confluent's TopicNameStrategy) in the schema registry, or with the schema file
``relay.schemas`` names for the topic, written by a writer compiled for the schema
(``outbox.avro_writer``, fastavro's bytes in half its time) or by fastavro, and framed (magic byte 0, the
schema's id, the body) as confluent-kafka's ``AvroSerializer`` frames them, for every
Confluent deserializer and Tidemark's ``format: avro`` ingest. Schemas are registered ahead:
a JSON payload names no schema, so only a file's schema can be registered from here, and
only with ``relay.auto_register``. A topic's schema is looked up and parsed once and kept (a
relay restarted after a new version is registered takes the new one); confluent-kafka's
serializer redid per payload work that had tripled the relay's CPU per event against JSON. A ``bytea`` payload is already a serialized
value: it passes unchanged, checked only to be in Confluent's framing.

What step 4 (``outbox.admission``) needs from here (``outbox.payloads``): the encoded values of a source
transaction's events, or why one cannot be encoded — a payload that does not match its
schema (:class:`InvalidPayload`, for the relay's ``on_invalid_payload`` policy), a subject
with no version (terminal: register it), a registry that does not answer (transient: the
relay stops with exit 75 before producing the transaction; its open Kafka transaction is
aborted and the slot sends everything unconfirmed again when it is run again).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro.validation import ValidationError, validate

from connectors.registry import client_config, refusal, registry_url, unreachable
from outbox.avro_writer import Writer, compile_writer
from outbox.payloads import InvalidPayload, check_framed, record_of
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.errors import ConfigError
from tidemark.settings import Settings


class AvroEncoder:
    def __init__(self, config: SchemaRegistryConfig, settings: Settings, relay: RelayConfig | None = None) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = registry_url(config, settings)
        self._client = SchemaRegistryClient(client_config(config, self.url))
        self._writers: dict[str, tuple[bytes, Any, Writer | None]] = {}
        """Per topic: the frame's head (magic byte, schema id), fastavro's parsed schema, and the
        schema's compiled writer (``outbox.avro_writer``; None where it covers not all of it)."""
        self._files = dict(relay.schemas) if relay is not None else {}
        self._auto_register = relay.auto_register if relay is not None else False
        self._schema_texts = {topic: _schema_text(topic, path) for topic, path in self._files.items()}

    def _writer(self, topic: str) -> tuple[bytes, Any, Writer | None]:
        """The topic's schema, looked up once: its file's (registered, or registered now with
        ``auto_register``), else the subject's newest version."""
        found = self._writers.get(topic)
        if found is None:
            from confluent_kafka.schema_registry import Schema

            subject = f"{topic}-value"
            text = self._schema_texts.get(topic)
            if text is None:
                latest = self._client.get_latest_version(subject)
                schema_id, text = int(latest.schema_id or 0), str(latest.schema.schema_str)
            elif self._auto_register:
                schema_id = int(self._client.register_schema(subject, Schema(text, "AVRO")))
            else:
                schema_id = int(self._client.lookup_schema(subject, Schema(text, "AVRO")).schema_id or 0)
            parsed = json.loads(text)
            found = (b"\x00" + schema_id.to_bytes(4, "big"), fastavro.parse_schema(parsed), compile_writer(parsed))
            self._writers[topic] = found
        return found

    def encode(self, topic: str, payload: bytes | None, *, serialized: bool = False) -> bytes | None:
        """The payload as its topic's Avro value (None stays None: a tombstone); a ``serialized``
        payload (from a ``bytea`` column) as it is, once it is seen to be framed."""
        if payload is None:
            return None
        if serialized:
            return check_framed(payload, 5)
        record = record_of(payload)
        try:
            head, schema, write = self._writer(topic)
        except SchemaRegistryError as exc:
            raise self._refused(topic, exc) from None
        except Exception as exc:  # noqa: BLE001 - httpx's and the OS's connection failures
            raise unreachable(self.url, exc, waits="run the relay again once it answers") from None
        return head + _body(topic, schema, write, record)

    def _refused(self, topic: str, exc: Any) -> Exception:
        subject = f"{topic}-value"
        if exc.http_status_code == 404 and topic in self._files:
            return ConfigError(f"relay.schemas: {self._files[topic]} is not registered under {subject!r} at "
                               f"{self.url}; register it there (or set relay.auto_register: true), then "
                               "start the relay again")
        if exc.http_status_code == 404:
            return ConfigError(f"relay.format avro: subject {subject!r} has no schema in the registry at "
                               f"{self.url}; register the topic's schema there, then start the relay again")
        if exc.http_status_code == 409:
            return ConfigError(f"relay.auto_register: the registry at {self.url} refuses {self._files.get(topic)} "
                               f"as a new version of {subject!r} (incompatible with its versions under the "
                               "subject's compatibility rule); make the schema compatible, then start the "
                               "relay again")
        return refusal(self.url, f"the relay's lookup of {subject!r}", exc, waits="run the relay again once it answers")


def _body(topic: str, schema: Any, write: Writer | None, record: Any) -> bytes:
    """``record``'s Avro body: by the compiled writer, else (what it does not take) by fastavro once
    validation has taken the record."""
    if write is not None:
        try:
            return write(record)
        except Exception:  # noqa: BLE001 - whatever it does not take, validation judges
            _validated(topic, schema, record)
    return _written(topic, schema, record)


def _written(topic: str, schema: Any, record: Any) -> bytes:
    """``record`` as an Avro body (fastavro, as confluent-kafka's serializer writes it), or why not:
    fastavro's validation names the field when its writer's refusal does not."""
    body = io.BytesIO()
    try:
        fastavro.schemaless_writer(body, schema, record)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        _validated(topic, schema, record)
        raise InvalidPayload(f"the payload does not match the schema of {topic}-value: {exc}") from None
    return body.getvalue()


def _validated(topic: str, schema: Any, record: Any) -> None:
    """Return if fastavro's validation takes ``record``; else :class:`InvalidPayload` naming the field.
    Stricter than fastavro's writer, which writes an int past 32 bits into an ``int`` (bytes no
    Avro reader takes) and anything into a ``null``; too slow (15 µs a record) to ask first
    where no compiled writer has refused the record."""
    try:
        validate(record, schema, raise_errors=True)
    except ValidationError as named:
        why = "; ".join(map(str, getattr(named, "errors", ()))) or str(named)
        raise InvalidPayload(f"the payload does not match the schema of {topic}-value: {why}") from None


def _schema_text(topic: str, path: Path) -> str:
    """A ``relay.schemas`` file's schema, checked to be Avro before anything is relayed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        fastavro.parse_schema(json.loads(text))
    except OSError as exc:
        raise ConfigError(f"relay.schemas[{topic!r}]: cannot read {path} ({exc.strerror})") from None
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ConfigError(f"relay.schemas[{topic!r}]: {path} is not an Avro schema ({exc})") from None
    return text
