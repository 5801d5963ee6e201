"""``relay.format: protobuf``: an event's ``jsonb`` payload as Protobuf, in Confluent's framing.

Each topic's values are serialized with the newest version of its subject (``<topic>-value``)
in the schema registry, as that version's first message, from the payload's JSON (Protobuf's
canonical JSON mapping: field names or their JSON names, enums by name, 64-bit integers as
numbers or strings), then framed as Confluent's serializers frame them (magic byte 0, the
id, the message indexes, the body), which Tidemark's ``format: protobuf`` ingest and every
Confluent deserializer read. Most payloads are read by the message class's constructor, which
gives the same message in a tenth of the time; those it could read otherwise go to the JSON
mapping itself (:func:`_constructor_agrees`). Schemas are registered ahead. A field the
schema lacks, or a value of the wrong type, is an invalid payload (``on_invalid_payload``), never dropped
silently: the JSON mapping refuses it. A field the message lacks first makes the relay ask for
the subject's newest version (once per subject every few seconds), which it uses from then
on, and the payload is invalid only if that version lacks the field too. The schema of a
topic is looked up once and kept, and the subject is asked for a newer version every
``relay.schema_refresh_seconds``. A ``bytea`` payload passes unchanged, checked only to be
framed. The registry's answers are :mod:`connectors.registry`'s: one that does not answer a
lookup the payload needs is :class:`outbox.payloads.RegistryOutage` (the relay waits before
producing the transaction).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from connectors.protobuf_schemas import compile_schema, frame, indexes, message
from connectors.registry import Registry
from outbox.payloads import InvalidPayload, RegistryOutage, SubjectClock, check_framed, record_of
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.errors import ConfigError, RegistryUnavailableError
from tidemark.settings import Settings

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name


@dataclass
class _Target:
    schema_id: int
    indexes: list[int]
    make: Any
    """The message's class (a new, empty message per call)."""
    refresh_at: float
    """When the subject is asked again for a newer version (monotonic)."""

    @property
    def what(self) -> str:
        return f"schema id {self.schema_id}"


class ProtobufEncoder:
    def __init__(self, config: SchemaRegistryConfig, settings: Settings, relay: RelayConfig | None = None) -> None:
        self._registry = Registry(config, settings)
        self.url = self._registry.url
        self._targets: dict[str, _Target] = {}
        self._clock = SubjectClock(relay.schema_refresh_seconds if relay is not None else 60.0)

    def _target(self, topic: str) -> _Target:
        """The topic's message: looked up (the relay waits for a registry that does not answer), or the
        one kept, checked against the subject's newest version once due (kept while the registry does
        not answer)."""
        found = self._targets.get(topic)
        if found is None:
            return self._newest(topic, None)
        if self._clock.now() < found.refresh_at:
            return found
        if not self._clock.may_refresh():
            found.refresh_at = self._clock.next_refresh()
            return found
        try:
            return self._newest(topic, found)
        except (RegistryUnavailableError, ConfigError) as exc:  # a refusal too: the kept version still serves
            self._clock.refresh_failed(self._registry.url, f"{topic}-value", exc, found.what)
            found.refresh_at = self._clock.next_refresh()
            return found

    def _newest(self, topic: str, kept: _Target | None) -> _Target:
        """The first message of the subject's newest version (``kept`` if it is that one), used from now on."""
        from google.protobuf import message_factory

        subject = f"{topic}-value"
        try:
            versions = self._registry.versions(subject)
        except RegistryUnavailableError as exc:
            raise RegistryOutage(self._registry.url, subject, str(exc).split("; ")[0]) from None
        if not versions:
            raise ConfigError(f"relay.format protobuf: subject {subject!r} has no schema in the registry at "
                              f"{self._registry.url}; register the topic's schema there, then start the relay "
                              "again")
        newest = versions[-1].schema_id
        if kept is not None and kept.schema_id == newest:
            kept.refresh_at = self._clock.next_refresh()
            return kept
        what = f"schema id {newest} of subject {subject!r}"
        try:
            text = self._registry.schema(newest)
            imports = self._registry.imports(newest) if text is not None else None
        except RegistryUnavailableError as exc:
            raise RegistryOutage(self._registry.url, subject, str(exc).split("; ")[0]) from None
        if text is None:
            raise ConfigError(f"{what} vanished from the registry at {self._registry.url} while the relay read "
                              "it; start the relay again")
        descriptor = message(compile_schema(text, what, imports), None, what)
        found = _Target(newest, indexes(descriptor), message_factory.GetMessageClass(descriptor),
                        self._clock.next_refresh())
        if kept is not None:
            log.warning("subject %s: the relay serializes with schema id %d from now on (was %d)", subject, newest,
                        kept.schema_id)
        self._targets[topic] = found
        return found

    def encode(self, topic: str, payload: bytes | None, *, serialized: bool = False) -> bytes | None:
        """The payload as its topic's Protobuf value (None stays None: a tombstone); a ``serialized``
        payload (from a ``bytea`` column) as it is, once it is seen to be framed."""
        if payload is None:
            return None
        if serialized:
            return check_framed(payload, 6)
        target = self._target(topic)
        record = record_of(payload)
        try:
            body = _body(target, record)
        except json_format.ParseError as exc:
            subject = f"{topic}-value"
            if _UNKNOWN not in str(exc):
                raise InvalidPayload(f"the payload does not match the schema of {subject}: {exc}") from None
            self._clock.wait_to_ask(subject)
            newer = self._newest(topic, target)
            self._clock.asked(subject)
            try:
                body = _body(newer, record)
            except json_format.ParseError as still:
                raise InvalidPayload(f"the payload does not match the schema of {subject} (its newest version, "
                                     f"{newer.what}): {still}") from None
            target = newer
        return frame(target.schema_id, target.indexes, body)


#: How the JSON mapping's refusal of a field the message lacks begins its reason.
_UNKNOWN = "has no field named"


def _body(target: _Target, record: Any) -> bytes:
    """``record`` as ``target``'s message body: by the message class's constructor where it reads the
    record as the JSON mapping would, else by the mapping (its ``ParseError`` says why not)."""
    if _constructor_agrees(record, target.make.DESCRIPTOR):
        try:
            return bytes(target.make(**record).SerializeToString())
        except (ValueError, TypeError):  # e.g. a JSON name, an int64 as a string: the mapping decides
            pass
    try:
        return bytes(json_format.ParseDict(record, target.make()).SerializeToString())
    except (ValueError, TypeError) as exc:
        if isinstance(exc, json_format.ParseError):
            raise
        raise json_format.ParseError(str(exc)) from None


#: The largest finite float32: a larger number is refused by the JSON mapping, made infinite by the constructor.
_FLOAT_MAX = 3.4028234663852886e38


def _constructor_agrees(record: Any, descriptor: Any) -> bool:
    """Whether the message class's constructor (C, ~1 µs) reads ``record`` as Protobuf's JSON
    mapping (``json_format.ParseDict``, pure Python, ~35 µs) would, so the relay may take it. It
    refuses most of what the mapping refuses, and what it cannot read the mapping reads instead;
    what it would take that the mapping does not, it never sees: a bool given as a number, a
    float past float32's range, and the JSON forms of bytes (base64) and well-known types."""
    if not isinstance(record, dict):
        return False
    names, checked = _checks(descriptor)
    if not names.issuperset(record):
        return False  # a JSON name (camelCase) or no such field: the mapping decides
    for name, field in checked:
        value = record.get(name)
        if value is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if not isinstance(value, dict) or not all(_value_agrees(entry, v) for v in value.values()):
                return False
        elif field.is_repeated:
            if not isinstance(value, list) or not all(_value_agrees(field, v) for v in value):
                return False
        elif not _value_agrees(field, value):
            return False
    return True


@functools.cache
def _checks(descriptor: Any) -> tuple[frozenset[str], tuple[tuple[str, Any], ...]]:
    """A message's field names, and the fields whose values :func:`_value_agrees` must see: those
    of a message, bool, float or bytes kind, repeated or maps (the rest the constructor refuses
    wherever the mapping would)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    kinds = {F.TYPE_BOOL, F.TYPE_FLOAT, F.TYPE_BYTES}
    checked = tuple((f.name, f) for f in descriptor.fields
                    if f.message_type is not None or f.is_repeated or f.type in kinds)
    return frozenset(descriptor.fields_by_name), checked


def _value_agrees(field: Any, value: Any) -> bool:
    if field.message_type is not None:
        return (not field.message_type.full_name.startswith("google.protobuf.")
                and _constructor_agrees(value, field.message_type))
    if field.type == field.TYPE_BOOL:
        return isinstance(value, bool)
    if field.type == field.TYPE_FLOAT and isinstance(value, int | float) and not isinstance(value, bool):
        return abs(value) <= _FLOAT_MAX or math.isnan(value)  # NaN: both read it
    return field.type != field.TYPE_BYTES
