"""The relay's schemas as the registry changes or fails (outbox.avro, outbox.payloads, outbox.outage),
against a stand-in for the registry's client: a payload field the schema lacks is never dropped,
the registry is asked about it at most once per subject every few seconds, a newer version is
taken on such a miss or once the refresh is due, and a registry that does not answer is waited
for and counted as the registry's outage, never Kafka's."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from outbox.avro import AvroEncoder, unknown_field
from outbox.payloads import InvalidPayload, RegistryOutage
from outbox.relay import Relay
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.settings import load_settings

URL = "http://registry.test/apis/ccompat/v7"
V1 = {"type": "record", "name": "Changed", "fields": [{"name": "key", "type": "string"},
                                                      {"name": "seq", "type": "long"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": ""}]}


def test_a_field_the_schema_lacks_is_found_at_the_top_and_in_nested_records() -> None:
    address = {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]}
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "ship_to", "type": address},
        {"name": "bill_to", "type": ["null", {**address, "name": "Billing"}]},
        {"name": "lines", "type": {"type": "array", "items": {**address, "name": "Line"}}}]}
    unknown = unknown_field(schema)
    assert unknown({"id": 1, "ship_to": {"city": "x"}, "bill_to": None, "lines": []}) is None
    assert unknown({"id": 1, "channel": "web"}) == "channel"
    assert unknown({"id": 1, "ship_to": {"city": "x", "zip": "1"}}) == "ship_to.zip"
    assert unknown({"id": 1, "bill_to": {"cty": "x"}}) == "bill_to.cty"
    assert unknown({"id": 1, "lines": [{"more": 1}]}) is None  # not looked into: the writers judge it
    assert unknown([1, 2]) is None and unknown_field({"type": "string"})({"a": 1}) is None


@dataclass
class _Registered:
    schema_id: int
    version: int
    schema: Any


class _Client:
    """The registry's client: its subject's versions, or an error for every call while ``down``."""

    def __init__(self, *schemas: dict[str, Any]) -> None:
        self.versions = list(schemas)
        self.asked = 0
        self.down = False

    def get_version(self, subject: str, version: str) -> _Registered:
        self.asked += 1
        if self.down:
            raise ConnectionError("[Errno 111] Connection refused")
        text = json.dumps(self.versions[-1])
        return _Registered(len(self.versions) + 10, len(self.versions), type("S", (), {"schema_str": text})())


def _encoder(client: _Client, **relay: Any) -> AvroEncoder:
    encoder = AvroEncoder(SchemaRegistryConfig(url=URL), load_settings(), RelayConfig(format="avro", **relay))
    encoder._client = client
    return encoder


def _id(value: bytes | None) -> int:
    assert value is not None and value[0] == 0
    return int.from_bytes(value[1:5], "big")


def _clock(encoder: AvroEncoder) -> tuple[list[float], list[float]]:
    """A stand-in for the encoder's clock, which its waits move on: (now, each wait)."""
    now, slept = [1000.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    encoder._clock.now = lambda: now[0]
    encoder._clock.sleep = sleep
    return now, slept


def test_a_field_no_version_has_is_invalid_and_asked_about_once_per_few_seconds() -> None:
    client = _Client(V1)
    encoder = _encoder(client)
    _, slept = _clock(encoder)
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 1}')) == 11
    for _ in range(3):
        with pytest.raises(InvalidPayload, match=r"t-value.*'chanel'.*version 1 \(id 11\)"):
            encoder.encode("t", b'{"key": "a", "seq": 1, "chanel": "web"}')
    # The first lookup, then one ask per miss, each after the last by MISS_ASK_SECONDS.
    assert client.asked == 4 and slept == [5.0, 5.0]


def test_a_version_registered_just_after_a_miss_is_taken_not_refused_by_the_older_answer() -> None:
    client = _Client(V1)
    encoder = _encoder(client)
    now, slept = _clock(encoder)
    with pytest.raises(InvalidPayload, match="'channel'"):
        encoder.encode("t", b'{"key": "a", "seq": 1, "channel": "web"}')
    now[0] += 1
    client.versions.append(V2)
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 2, "channel": "web"}')) == 12
    assert slept == [4.0]


def test_a_newer_version_with_the_field_is_taken_on_the_miss_and_kept() -> None:
    client = _Client(V1)
    encoder = _encoder(client)
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 1}')) == 11
    client.versions.append(V2)
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 2, "channel": "web"}')) == 12
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 3}')) == 12
    assert client.asked == 2


def test_a_newer_version_is_taken_once_the_refresh_is_due() -> None:
    client = _Client(V1)
    encoder = _encoder(client, schema_refresh_seconds=60)
    now, _ = _clock(encoder)
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 1}')) == 11
    client.versions.append(V2)
    now[0] += 59
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 2}')) == 11 and client.asked == 1
    now[0] += 2
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 3}')) == 12 and client.asked == 2


def test_a_registry_that_does_not_answer_is_waited_for_on_a_lookup_and_outlasted_on_a_refresh() -> None:
    client = _Client(V1)
    client.down = True
    encoder = _encoder(client, schema_refresh_seconds=60)
    now, _ = _clock(encoder)
    with pytest.raises(RegistryOutage, match=r"registry\.test.*subject 't-value'.*Connection refused") as raised:
        encoder.encode("t", b'{"key": "a", "seq": 1}')
    assert (raised.value.url, raised.value.subject) == (URL, "t-value")
    client.down = False
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 1}')) == 11
    client.down = True
    now[0] += 61
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 2}')) == 11  # the version it has still serves
    with pytest.raises(RegistryOutage):  # a payload that needs the registry waits for it
        encoder.encode("t", b'{"key": "a", "seq": 3, "channel": "web"}')
    assert _id(encoder.encode("t", b'{"key": "a", "seq": 4}')) == 11


def test_a_bytea_payload_is_not_checked_for_fields() -> None:
    client = _Client(V1)
    framed = b"\x00\x00\x00\x00\x07anything"
    assert _encoder(client).encode("t", framed, serialized=True) == framed and client.asked == 0


def test_a_registry_outage_is_counted_and_logged_as_the_registry_s(caplog: pytest.LogCaptureFixture) -> None:
    relay = Relay(RelayConfig(), dsn="", client_config={})
    sessions = iter([True, True])

    def session(stop: threading.Event, idle_exit: float | None) -> None:
        if next(sessions, None) is None:
            relay.registry.answered(["u"])  # a topic whose schema the relay holds: no answer yet
            assert relay.report.registry_down
            relay.registry.answered(["u", "t"])
            return
        raise RegistryOutage(URL, "t-value", "ConnectError: refused")

    class Clock(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            assert relay.report.registry_down
            return False

    relay._session = session  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="outbox.relay"):
        relay.run(Clock())
    report = relay.report
    assert (report.registry_outages, report.outages, report.registry_down) == (1, 0, False)
    lines = [r.getMessage() for r in caplog.records]
    assert URL in lines[0] and "'t-value'" in lines[0] and "Kafka" not in " ".join(lines), lines
    assert [line.startswith("waiting 1 s") for line in lines[1:2]] == [True], lines
    assert lines[2].startswith("waiting 2 s") and "answers again" in lines[3] and len(lines) == 4, lines
