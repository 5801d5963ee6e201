"""A registry's .proto compiled to descriptors, Confluent's Protobuf framing, and the columns of a message."""

from __future__ import annotations

import pytest

from connectors.protobuf_schemas import compile_schema, frame, indexes, message
from tidemark.errors import ConfigError

SCHEMA = '''syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int32 id = 1; optional string note = 2; Status status = 3; repeated string tags = 4;
  google.protobuf.Timestamp at = 5; map<string, int64> counts = 6; Line line = 7; uint32 small = 8;
  uint64 big = 9; bytes blob = 10; float ratio = 11; repeated Line lines = 12;
  message Line { string sku = 1; double price = 2; }
}
message Refund { string order_id = 1; }
enum Status { NEW = 0; PAID = 1; }
'''


def test_a_schema_compiles_with_its_imports_and_its_messages_in_file_order() -> None:
    compiled = compile_schema(SCHEMA, "test")
    assert compile_schema(SCHEMA, "test") is compiled  # once per text
    assert message(compiled, None, "test").full_name == "shop.Order"  # the first message by default
    assert message(compiled, "shop.Refund", "test").full_name == "shop.Refund"
    with pytest.raises(ConfigError, match="has no message 'shop.Nope' .*shop.Order, shop.Refund"):
        message(compiled, "shop.Nope", "test")


def test_a_schema_that_is_not_protobuf_or_does_not_compile_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="is not a Protobuf schema"):
        compile_schema('{"type": "record", "name": "A", "fields": []}', "schema id 3")
    with pytest.raises(ConfigError, match="schema id 4 does not compile .*schema references"):
        compile_schema('syntax = "proto3";\nimport "other/subject.proto";\nmessage A { other.B b = 1; }\n',
                       "schema id 4")


def test_confluent_message_indexes_and_framing() -> None:
    compiled = compile_schema(SCHEMA, "test")
    order, refund = message(compiled, "shop.Order", "t"), message(compiled, "shop.Refund", "t")
    line = message(compiled, "shop.Order.Line", "t")
    # Line is Order's second nested type: the map field's entry type (CountsEntry) comes first.
    assert (indexes(order), indexes(refund), indexes(line)) == ([0], [1], [0, 1])
    # Confluent's serializer: [0] as the single byte 0; otherwise the count, then each, zig-zag varints.
    assert frame(7, [0], b"body") == b"\x00\x00\x00\x00\x07\x00body"
    assert frame(7, [1], b"") == b"\x00\x00\x00\x00\x07\x02\x02"
    assert frame(258, [0, 0], b"x") == b"\x00\x00\x00\x01\x02\x04\x00\x00x"
    assert frame(1, [70], b"")[5:] == b"\x02\x8c\x01"  # 70 zig-zags to 140: two varint bytes


def test_a_message_maps_to_columns_in_its_field_order() -> None:
    from pipelines.protobuf import columns

    compiled = compile_schema(SCHEMA, "test")
    got = {f.name: f.dataType.simpleString() for f in columns(message(compiled, None, "t")).fields}
    assert list(got) == ["id", "note", "status", "tags", "at", "counts", "line", "small", "big", "blob", "ratio",
                         "lines"]
    assert got == {"id": "int", "note": "string", "status": "string", "tags": "array<string>", "at": "timestamp",
                   "counts": "map<string,bigint>", "line": "struct<sku:string,price:double>", "small": "bigint",
                   "big": "bigint", "blob": "binary", "ratio": "float",
                   "lines": "array<struct<sku:string,price:double>>"}


def test_a_recursive_message_stops_with_a_clear_line() -> None:
    from pipelines.protobuf import columns

    compiled = compile_schema('syntax = "proto3";\nmessage Node { string name = 1; Node next = 2; }\n', "t")
    with pytest.raises(ConfigError, match="nests deeper than .* recursive"):
        columns(message(compiled, None, "t"))


@pytest.mark.parametrize(("fields", "error"), [
    ({"format": "protobuf", "schema": "id INT"}, "format protobuf takes its schema from the registry"),
    ({"format": "protobuf", "topics": ["a", "b"]}, "format protobuf reads one subject"),
    ({"format": "avro", "message": "shop.Order"}, "applies to format: protobuf"),
])
def test_a_protobuf_pipeline_is_checked_when_the_config_is_read(fields: dict[str, object], error: str) -> None:
    from tidemark.config import parse_config

    with pytest.raises(ConfigError, match=error):
        parse_config({"pipelines": [{"name": "p", "topics": ["orders"], "target": "/t", **fields}]})
    good = parse_config({"pipelines": [{"name": "p", "topics": ["orders"], "target": "/t", "format": "protobuf",
                                        "message": "shop.Order"}]}).pipelines[0]
    assert (good.registry_subject, good.message, good.uses_registry) == ("orders-value", "shop.Order", True)


_RELAYED = '''syntax = "proto3";
package p;
enum K { A = 0; B = 1; }
message In { string s = 1; bool on = 2; repeated float fs = 3; }
message M {
  string name = 1; int64 n = 2; int32 i = 3; double d = 4; bool b = 5; K k = 6; In inner = 7;
  repeated int32 r = 8; map<string, In> m = 9; string camel_case = 10; float f = 11; bytes raw = 12;
  uint32 u = 13; repeated bool flags = 14;
}
'''


def test_the_relays_constructor_path_gives_the_json_mappings_message_or_leaves_it_to_the_mapping() -> None:
    """``outbox.protobuf``: where the relay takes a payload by the message class's constructor, the
    bytes are those Protobuf's JSON mapping gives (and the mapping would not refuse it)."""
    import random

    from google.protobuf import json_format, message_factory

    from outbox.protobuf import _constructor_agrees

    descriptor = message(compile_schema(_RELAYED, "t"), "p.M", "t")
    make = message_factory.GetMessageClass(descriptor)
    rng = random.Random(11)
    odd = [None, True, False, 0, 1, -1, 2**31, 2**40, -(2**63), 2**64, 1.0, 1.5, 1e40, float("nan"), "", "B", "C",
           "12", "AAE=", "x", [], [1, True], {}, {"s": "x"}, {"s": 1}, {"on": 1}, {"fs": [1e39]}]
    names = [f.name for f in descriptor.fields] + ["camelCase", "nope"]
    taken = 0
    for _ in range(3000):
        record = {rng.choice(names): rng.choice(odd) for _ in range(rng.randrange(1, 5))}
        if rng.random() < 0.3:
            record["m"] = {"k": rng.choice(odd)}
        try:
            mapped: bytes | None = json_format.ParseDict(record, make()).SerializeToString()
        except (json_format.ParseError, ValueError, TypeError):
            mapped = None
        if not _constructor_agrees(record, descriptor):
            continue
        try:
            built = make(**record).SerializeToString()
        except (ValueError, TypeError):
            continue  # the relay then asks the mapping
        taken += 1
        assert built == mapped, record
    assert taken > 100  # the constructor's path is taken, and never where it would differ
