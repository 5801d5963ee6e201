"""Avro records in Confluent's wire format, and schemas in a real registry, for the avro tests."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro


def register(url: str, subject: str, schema: dict[str, Any]) -> int:
    """Register ``schema`` under ``subject``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return int(SchemaRegistryClient({"url": url}).register_schema(subject, Schema(json.dumps(schema), "AVRO")))


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """``record`` as a Confluent serializer writes it: magic byte 0, the id, the Avro body."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return struct.pack(">bI", 0, schema_id) + body.getvalue()
