"""The encoder of ``relay.format``: :mod:`outbox.avro`, :mod:`outbox.protobuf`, or none for ``json``."""

from __future__ import annotations

from outbox.payloads import PayloadEncoder
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.settings import Settings


def encoder_for(relay: RelayConfig, registry: SchemaRegistryConfig, settings: Settings) -> PayloadEncoder | None:
    """The encoder of ``relay.format`` (None for ``json``: payloads go as their text)."""
    if relay.format == "avro":
        from outbox.avro import AvroEncoder

        return AvroEncoder(registry, settings, relay)
    if relay.format == "protobuf":
        from outbox.protobuf import ProtobufEncoder

        return ProtobufEncoder(registry, settings, relay)
    return None
