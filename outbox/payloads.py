"""What step 4 of the relay (``outbox.admission``) needs of a registry format's encoder.

``relay.format: avro`` (:mod:`outbox.avro`) and ``protobuf`` (:mod:`outbox.protobuf`) share
this shape: the encoded value of an event's payload on its topic, in Confluent's framing, or
:class:`InvalidPayload` for the relay's ``on_invalid_payload`` policy. A ``bytea`` payload is a
value the application serialized itself: it passes unchanged, checked only to be framed.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import orjson


class InvalidPayload(Exception):
    """This event's payload cannot be serialized with its subject's schema (the reason says why)."""


class PayloadEncoder(Protocol):
    def encode(self, topic: str, payload: bytes | None, *, serialized: bool = False) -> bytes | None:
        """The payload as its topic's value (None stays None: a tombstone)."""


def check_framed(payload: bytes, shortest: int) -> bytes:
    """A ``bytea`` payload as it is, once seen to be in Confluent's framing (magic byte 0, a 4-byte
    schema id, then the body: at least ``shortest`` bytes)."""
    if len(payload) < shortest or payload[0] != 0:
        raise InvalidPayload(f"the bytea payload is not in Confluent's framing (magic byte 0, a 4-byte "
                             f"schema id, the body): it starts {payload[:5].hex() or 'empty'}")
    return payload


def record_of(payload: bytes) -> Any:
    """A ``jsonb`` payload's JSON (always valid from PostgreSQL; checked for a payload from elsewhere).
    By orjson (a third of ``json``'s time per payload), else by ``json``, which also reads what
    orjson refuses (integers past 64 bits)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(payload)
    except ValueError as exc:
        raise InvalidPayload(f"the payload is not JSON ({exc})") from None
