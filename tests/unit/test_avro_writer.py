"""The relay's compiled Avro writers (``outbox.avro_writer``) against fastavro's, on random records."""

from __future__ import annotations

import io
import random
from typing import Any

import fastavro
import pytest
from fastavro.validation import validate

from outbox.avro_writer import compile_writer

SCHEMA = {"type": "record", "name": "Changed", "namespace": "shop", "fields": [
    {"name": "key", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "n", "type": "int"},
    {"name": "amount", "type": "double"}, {"name": "ratio", "type": "float"}, {"name": "ok", "type": "boolean"},
    {"name": "nothing", "type": "null"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "level", "type": ["long", "null"], "default": 3},
    {"name": "currency", "type": "string", "default": "EUR"},
    {"name": "when", "type": ["null", {"type": "enum", "name": "When", "symbols": ["NOW", "LATER"]}]},
    {"name": "line", "type": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "price", "type": {"type": "double"}},
        {"name": "qty", "type": ["null", "int"], "default": None}]}},
]}

ODD: list[Any] = [None, True, False, 0, 1, -1, 63, 64, -65, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1,
                  2**63, -(2**63), 2**70, 0.0, -2.5, 1e39, 1e300, float("inf"), float("nan"), "", "x", "é" * 40,
                  "NEW", "PAID", "NOW", "y" * 200, b"raw", [], {}, {"sku": "a", "price": 1}, {"sku": 1, "price": 1.0}]


def _fastavro(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def _valid(record: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(len(record))
    return {"key": "k", "seq": rng.randrange(-(2**63), 2**63), "n": -7, "amount": 12.5, "ratio": 0.1, "ok": True,
            "nothing": None, "status": "PAID", "line": {"sku": "s", "price": 3}, "when": "LATER", **record}


def test_a_compiled_writer_writes_fastavros_bytes_or_refuses_and_refuses_every_invalid_record() -> None:
    """Where the compiled writer writes, it writes fastavro's bytes of a record fastavro's validation
    takes; every record validation refuses, it refuses too (the relay then asks fastavro, which
    names the field). Random records: valid ones with one field changed to an odd value or dropped."""
    parsed = fastavro.parse_schema(SCHEMA)
    write = compile_writer(SCHEMA)
    assert write is not None
    rng = random.Random(5)
    names = [f["name"] for f in SCHEMA["fields"]]
    written = refused = 0
    for _ in range(4000):
        record = _valid({})
        for _ in range(rng.randrange(0, 3)):
            name = rng.choice(names)
            if rng.random() < 0.2:
                record.pop(name, None)
            else:
                record[name] = rng.choice(ODD)
        line = record.get("line")
        if rng.random() < 0.2 and isinstance(line, dict):
            record["line"] = {**line, rng.choice(["sku", "price", "qty"]): rng.choice(ODD)}
        is_valid = validate(record, parsed, raise_errors=False)
        try:
            out = write(record)
        except Exception:  # noqa: BLE001 - any refusal sends the record to fastavro
            refused += 1
            continue
        written += 1
        assert is_valid, record
        assert out == _fastavro(parsed, record), record
    assert written > 1000 and refused > 500  # both paths are taken


def test_a_valid_record_of_every_covered_type_is_written_as_fastavro_writes_it() -> None:
    parsed = fastavro.parse_schema(SCHEMA)
    write = compile_writer(SCHEMA)
    assert write is not None
    for record in (_valid({}), _valid({"note": "hi", "level": None, "currency": "USD", "when": None}),
                   _valid({"seq": -(2**63), "n": 2**31 - 1, "amount": 1e300, "key": "ü" * 70}),
                   _valid({"line": {"sku": "", "price": -0.0, "qty": 64}, "ok": False, "ratio": 1})):
        assert write(record) == _fastavro(parsed, record)


@pytest.mark.parametrize("part", [
    {"type": "array", "items": "int"}, {"type": "map", "values": "int"}, "bytes",
    {"type": "fixed", "name": "F", "size": 2}, {"type": "long", "logicalType": "timestamp-millis"},
    ["null", "int", "string"], ["null", {"type": "record", "name": "R", "fields": []}], "shop.Other",
])
def test_a_schema_with_a_part_not_covered_gets_no_compiled_writer(part: Any) -> None:
    assert compile_writer({"type": "record", "name": "T", "fields": [{"name": "f", "type": part}]}) is None
    assert compile_writer({"type": "record", "name": "T", "fields": [{"name": "f", "type": "int", "default": []}]}) \
        is None
    assert compile_writer({"type": "string"}) is None  # not a record


def test_the_relays_encoding_refuses_what_validation_refuses_naming_the_field() -> None:
    """``outbox.avro``: a record the compiled writer does not take is written by fastavro only if
    validation takes it: an int past 32 bits is not written into an ``int`` (fastavro's writer
    would); an int past a double's range is an invalid payload also where fastavro alone writes
    (its writer raised an OverflowError); one validation takes is fastavro's bytes."""
    from outbox.avro import _body
    from outbox.payloads import InvalidPayload

    parsed = fastavro.parse_schema(SCHEMA)
    write = compile_writer(SCHEMA)
    with pytest.raises(InvalidPayload, match=r"orders-value: shop\.Changed\.n is <1099511627776> .* expected int"):
        _body("orders", parsed, write, _valid({"n": 2**40}))
    for writer in (write, None):
        with pytest.raises(InvalidPayload, match="orders-value"):
            _body("orders", parsed, writer, _valid({"amount": 2**1100}))
        odd = _valid({"ratio": 1e39})  # valid, and a float's overflow the compiled writer leaves to fastavro
        assert _body("orders", parsed, writer, odd) == _fastavro(parsed, odd)
