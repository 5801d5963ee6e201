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
