"""Protobuf records in Confluent's wire format, and .proto schemas in a real registry, for the protobuf tests."""

from __future__ import annotations

from typing import Any

from connectors.protobuf_schemas import compile_schema, frame, indexes, message


def register(url: str, subject: str, proto: str, references: dict[str, tuple[str, int]] | None = None) -> int:
    """Register the ``.proto`` text ``proto`` under ``subject``, with schema references ``{import
    name: (subject, version)}``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

    refs = [SchemaReference(name, s, v) for name, (s, v) in (references or {}).items()]
    return int(SchemaRegistryClient({"url": url}).register_schema(subject, Schema(proto, "PROTOBUF", refs)))


def framed(schema_id: int, proto: str, record: dict[str, Any], name: str = "shop.Order",
           imports: dict[str, str] | None = None) -> bytes:
    """``record`` (Protobuf's JSON mapping) as a Confluent serializer writes it: magic byte 0, the
    id, the message indexes of ``name``, the body (``imports``: the files ``proto`` imports)."""
    from google.protobuf import json_format, message_factory

    descriptor = message(compile_schema(proto, "test schema", imports), name, "test schema")
    body = json_format.ParseDict(record, message_factory.GetMessageClass(descriptor)()).SerializeToString()
    return frame(schema_id, indexes(descriptor), body)
