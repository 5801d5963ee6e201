"""``relay.format: avro``: an event's ``jsonb`` payload as Avro, in Confluent's framing.

Each topic's values are serialized with the newest version of its subject (``<topic>-value``,
Confluent's TopicNameStrategy) in the schema registry, or with the schema file
``relay.schemas`` names for the topic, written by a writer compiled for the schema
(``outbox.avro_writer``, fastavro's bytes in half its time) or by fastavro, and framed (magic byte 0, the
schema's id, the body) as confluent-kafka's ``AvroSerializer`` frames them, for every
Confluent deserializer and Tidemark's ``format: avro`` ingest. Schemas are registered ahead:
a JSON payload names no schema, so only a file's schema can be registered from here, and
only with ``relay.auto_register``. A topic's schema is looked up and parsed once and kept,
and the subject is asked for a newer version every ``relay.schema_refresh_seconds``;
confluent-kafka's serializer redid per payload work that had tripled the relay's CPU per
event against JSON.

Both writers serialize a record's schema fields and ignore any other key, so a payload with a
field the schema lacks would reach Kafka without it. Such a payload is checked first (its keys
against the schema's field names, nested records' too): the subject's newest version is asked
for (once per subject every few seconds, :class:`outbox.payloads.SubjectClock`) and used from
then on; if it lacks the field as well (a misspelt field, a version not registered yet), the
payload is invalid. A file's schema is never swapped: a field the file lacks is invalid at once.
A ``bytea`` payload is already a serialized value: it passes unchanged, checked only to be in
Confluent's framing.

What step 4 (``outbox.admission``) needs from here (``outbox.payloads``): the encoded values of a source
transaction's events, or why one cannot be encoded — a payload that does not match its
schema (:class:`InvalidPayload`, for the relay's ``on_invalid_payload`` policy), a subject
with no version (terminal: register it), a registry that does not answer a lookup the
payload needs (:class:`RegistryOutage`: the relay waits before producing the transaction, and
relays it once the registry answers again).
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro.validation import ValidationError, validate

from connectors.registry import client_config, refusal, registry_url, unreachable
from outbox.avro_writer import Writer, compile_writer
from outbox.payloads import InvalidPayload, RegistryOutage, SubjectClock, check_framed, record_of
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.errors import ConfigError, RegistryUnavailableError
from tidemark.settings import Settings

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name

UnknownField = Callable[[Any], "str | None"]


@dataclass
class _Schema:
    """A topic's schema as the relay writes it."""

    head: bytes
    """The frame's head: magic byte, schema id."""
    parsed: Any
    """fastavro's parsed schema."""
    write: Writer | None
    """The compiled writer (``outbox.avro_writer``; None where it covers not all of it)."""
    names: frozenset[str]
    """The record's field names: a payload's keys within them (and no nested record) is the common case,
    checked in place."""
    nested: bool
    """Whether the record has fields of a record type, which :attr:`unknown` looks into."""
    unknown: UnknownField
    """The first of a record's fields the schema lacks (dotted in a nested record), or None."""
    what: str
    """The version, for messages: ``version 2 (id 7)``, or the file."""
    refresh_at: float
    """When the subject is asked again for a newer version (monotonic; never for a file)."""


class AvroEncoder:
    def __init__(self, config: SchemaRegistryConfig, settings: Settings, relay: RelayConfig | None = None) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = registry_url(config, settings)
        self._client = SchemaRegistryClient(client_config(config, self.url))
        self._schemas: dict[str, _Schema] = {}
        self._files = dict(relay.schemas) if relay is not None else {}
        self._auto_register = relay.auto_register if relay is not None else False
        self._schema_texts = {topic: _schema_text(topic, path) for topic, path in self._files.items()}
        self._clock = SubjectClock(relay.schema_refresh_seconds if relay is not None else 60.0)

    def encode(self, topic: str, payload: bytes | None, *, serialized: bool = False) -> bytes | None:
        """The payload as its topic's Avro value (None stays None: a tombstone); a ``serialized``
        payload (from a ``bytea`` column) as it is, once it is seen to be framed."""
        if payload is None:
            return None
        if serialized:
            return check_framed(payload, 5)
        record = record_of(payload)
        schema = self._schemas.get(topic)
        if schema is None or self._clock.now() >= schema.refresh_at:
            schema = self._schema(topic, schema)
        if type(record) is dict and (schema.nested or not schema.names.issuperset(record)):
            field = schema.unknown(record)
            if field is not None:
                schema = self._newer_with(topic, schema, record, field)
        return schema.head + _body(topic, schema.parsed, schema.write, record)

    def _schema(self, topic: str, kept: _Schema | None) -> _Schema:
        """The topic's schema: looked up (the relay waits for a registry that does not answer), or
        ``kept`` checked against the subject's newest version (kept while the registry does not answer)."""
        subject = f"{topic}-value"
        if kept is None:
            return self._ask(topic, lambda: self._lookup(topic))
        if not self._clock.may_refresh():
            kept.refresh_at = self._clock.next_refresh()
            return kept
        try:
            found = self._ask(topic, lambda: self._latest(topic, kept))
        except (RegistryUnavailableError, ConfigError) as exc:  # a refusal too: the kept version still serves
            self._clock.refresh_failed(self.url, subject, exc, kept.what)
            kept.refresh_at = self._clock.next_refresh()
            return kept
        return found

    def _newer_with(self, topic: str, schema: _Schema, record: Any, field: str) -> _Schema:
        """The subject's newest version if it has every field of ``record`` (used from then on), else
        :class:`InvalidPayload` naming ``field``, the first one ``schema`` lacks."""
        subject = f"{topic}-value"
        if topic in self._files:
            raise InvalidPayload(f"the payload does not match the schema of {subject}: it has field {field!r}, "
                                 f"which {schema.what} lacks; add the field there (and register it), or correct "
                                 "the payload")
        self._clock.wait_to_ask(subject)
        schema = self._ask(topic, lambda: self._latest(topic, schema))
        self._clock.asked(subject)
        missing = schema.unknown(record)
        if missing is None:
            return schema
        field = missing
        raise InvalidPayload(f"the payload does not match the schema of {subject}: it has field {field!r}, which "
                             f"{schema.what}, the subject's newest, lacks (a misspelt field, or a version not "
                             "registered yet)")

    def _latest(self, topic: str, kept: _Schema) -> _Schema:
        """The subject's newest version (``kept`` itself if it is that one), used from now on."""
        latest = self._client.get_version(f"{topic}-value", "latest")  # get_latest_version keeps its first answer
        schema_id = int(latest.schema_id or 0)
        if kept.head != _head(schema_id):
            found = _made(schema_id, str(latest.schema.schema_str), f"version {latest.version} (id {schema_id})",
                          self._clock.next_refresh())
            log.warning("subject %s-value: the relay serializes with its %s from now on (was %s)", topic,
                        found.what, kept.what)
            kept = self._schemas[topic] = found
        kept.refresh_at = self._clock.next_refresh()
        return kept

    def _lookup(self, topic: str) -> _Schema:
        """The topic's schema: its file's (registered, or registered now with ``auto_register``), else
        the subject's newest version."""
        from confluent_kafka.schema_registry import Schema

        subject = f"{topic}-value"
        text = self._schema_texts.get(topic)
        refresh_at = math.inf
        if text is None:
            latest = self._client.get_version(subject, "latest")
            schema_id, text = int(latest.schema_id or 0), str(latest.schema.schema_str)
            what, refresh_at = f"version {latest.version} (id {schema_id})", self._clock.next_refresh()
        elif self._auto_register:
            schema_id = int(self._client.register_schema(subject, Schema(text, "AVRO")))
            what = f"relay.schemas file {self._files[topic]} (id {schema_id})"
        else:
            schema_id = int(self._client.lookup_schema(subject, Schema(text, "AVRO")).schema_id or 0)
            what = f"relay.schemas file {self._files[topic]} (id {schema_id})"
        found = self._schemas[topic] = _made(schema_id, text, what, refresh_at)
        return found

    def _ask(self, topic: str, call: Callable[[], _Schema]) -> _Schema:
        """``call()``, the registry's failures as Tidemark's errors (one that does not answer: the relay waits)."""
        subject = f"{topic}-value"
        try:
            return call()
        except SchemaRegistryError as exc:
            error = self._refused(topic, exc)
        except Exception as exc:  # noqa: BLE001 - httpx's and the OS's connection failures
            error = unreachable(self.url, exc, waits="")
            if isinstance(error, RegistryUnavailableError):
                error = RegistryOutage(self.url, subject, f"{type(exc).__name__}: {exc}")
        raise error from None

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
        error = refusal(self.url, f"the relay's lookup of {subject!r}", exc, waits="")
        if isinstance(error, RegistryUnavailableError):
            return RegistryOutage(self.url, subject, f"HTTP {exc.http_status_code}: {exc.error_message}")
        return error


def _head(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big")


def _made(schema_id: int, text: str, what: str, refresh_at: float) -> _Schema:
    parsed = json.loads(text)
    fields = parsed.get("fields", ()) if isinstance(parsed, dict) else ()
    return _Schema(_head(schema_id), fastavro.parse_schema(parsed), compile_writer(parsed),
                   frozenset(f["name"] for f in fields), any(_record_in(f["type"]) is not None for f in fields),
                   unknown_field(parsed), what, refresh_at)


def unknown_field(schema: Any) -> UnknownField:
    """A check of a record against ``schema`` (as ``json.loads`` reads it): the first field the record
    has and the schema lacks, or None. Per payload it compares the record's keys with a frozenset of
    the schema's field names, and so the value of each field whose type is a record (or a union of
    null and one record) defined in place; records within arrays, maps or named references are not
    looked into. What is not a dict is left to the writer's validation."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return _nothing
    names = frozenset(f["name"] for f in schema.get("fields", ()))
    nested = tuple((f["name"], unknown_field(inner)) for f in schema.get("fields", ())
                   if (inner := _record_in(f["type"])) is not None)

    def check(record: Any) -> str | None:
        if type(record) is not dict:
            return None
        if not names.issuperset(record):
            return next(str(k) for k in record if k not in names)
        for name, inner in nested:
            value = record.get(name)
            if type(value) is dict:
                found = inner(value)
                if found is not None:
                    return f"{name}.{found}"
        return None

    return check


def _nothing(record: Any) -> None:
    return None


def _record_in(kind: Any) -> Mapping[str, Any] | None:
    """The record ``kind`` defines in place, alone or beside null in a union; else None."""
    if isinstance(kind, list):
        records = [k for k in kind if isinstance(k, Mapping) and k.get("type") == "record"]
        others = [k for k in kind if k != "null" and k not in records]
        return records[0] if len(records) == 1 and not others else None
    return kind if isinstance(kind, Mapping) and kind.get("type") == "record" else None


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
