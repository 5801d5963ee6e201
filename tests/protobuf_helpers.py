"""Protobuf records in Confluent's wire format, and .proto schemas in a real registry, for the protobuf tests."""

from __future__ import annotations

from typing import Any

from connectors.protobuf_schemas import compile_schema, frame, indexes, message


def register(url: str, subject: str, proto: str) -> int:
    """Register the ``.proto`` text ``proto`` under ``subject``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return int(SchemaRegistryClient({"url": url}).register_schema(subject, Schema(proto, "PROTOBUF")))


def framed(schema_id: int, proto: str, record: dict[str, Any], name: str = "shop.Order") -> bytes:
    """``record`` (Protobuf's JSON mapping) as a Confluent serializer writes it: magic byte 0, the
    id, the message indexes of ``name``, the body."""
    from google.protobuf import json_format, message_factory

    descriptor = message(compile_schema(proto, "test schema"), name, "test schema")
    body = json_format.ParseDict(record, message_factory.GetMessageClass(descriptor)()).SerializeToString()
    return frame(schema_id, indexes(descriptor), body)
