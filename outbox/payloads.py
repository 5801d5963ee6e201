"""What step 4 of the relay (``outbox.admission``) needs of a registry format's encoder.

``relay.format: avro`` (:mod:`outbox.avro`) and ``protobuf`` (:mod:`outbox.protobuf`) share
this shape: the encoded value of an event's payload on its topic, in Confluent's framing, or
:class:`InvalidPayload` for the relay's ``on_invalid_payload`` policy, or :class:`RegistryOutage`
for a registry the relay waits for (``outbox.outage``). A ``bytea`` payload is a value the
application serialized itself: it passes unchanged, checked only to be framed.

Both keep each topic's schema and ask the registry again on the same terms
(:class:`SubjectClock`): every ``relay.schema_refresh_seconds``, and when a payload has a field
the schema lacks, since serializing it would drop the field's value without a word.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from tidemark.errors import RegistryUnavailableError

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name

#: Least time between two asks about one subject on payloads with a field its schema lacks: a
#: stream of such payloads (a misspelt field) costs the registry one request per subject this
#: often, and each such payload waits for its own ask at most this long.
MISS_ASK_SECONDS = 5.0


class InvalidPayload(Exception):
    """This event's payload cannot be serialized with its subject's schema (the reason says why)."""


class RegistryOutage(RegistryUnavailableError):
    """The registry did not answer a lookup the relay cannot do without: it waits (``outbox.outage``)."""

    def __init__(self, url: str, subject: str, why: str) -> None:
        super().__init__(f"the schema registry at {url} does not answer the relay's lookup of subject "
                         f"{subject!r} ({why})")
        self.url = url
        self.subject = subject
        self.why = why


class SubjectClock:
    """When a relay asks the registry about a topic's subject again: a refresh once
    ``refresh_seconds`` have passed since the last one (a registry that did not answer one is not
    asked about any subject again for as long), and an ask on a payload's unknown field, at most
    once per :data:`MISS_ASK_SECONDS` per subject. Its ``now`` and ``sleep`` are the relay's whole
    sense of time for schemas, so a test replaces them here, never in the process-wide ``time``
    module that Spark's and Kafka's threads also run on."""

    def __init__(self, refresh_seconds: float) -> None:
        self.refresh_seconds = refresh_seconds
        self._asked: dict[str, float] = {}
        self._quiet_until = 0.0
        self.now: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep

    def next_refresh(self) -> float:
        """The monotonic time a schema taken now is due to be checked again."""
        return max(self.now() + self.refresh_seconds, self._quiet_until)

    def may_refresh(self) -> bool:
        return self.now() >= self._quiet_until

    def refresh_failed(self, url: str, subject: str, error: Exception, kept: str) -> None:
        """A refresh the registry did not answer: the relay goes on with the schema it has (``kept``)."""
        self._quiet_until = self.now() + self.refresh_seconds
        log.warning("the schema registry at %s did not answer the relay's check of subject %r for a newer version "
                    "(%s); the relay goes on with %s and asks again in %.0f s", url, subject,
                    error.why if isinstance(error, RegistryOutage) else error, kept, self.refresh_seconds)

    def wait_to_ask(self, subject: str) -> None:
        """Wait until a payload's unknown field may ask the registry about ``subject``: at most
        :data:`MISS_ASK_SECONDS`. Never a refusal from an older answer: a version registered
        since would then refuse a payload that it describes."""
        last = self._asked.get(subject)
        if last is not None:
            self.sleep(max(0.0, last + MISS_ASK_SECONDS - self.now()))

    def asked(self, subject: str) -> None:
        """The registry answered an ask on an unknown field (its answer is the schema kept)."""
        self._asked[subject] = self.now()


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
