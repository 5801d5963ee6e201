"""``format: protobuf``: Confluent-framed Protobuf, each record parsed with its own writer schema.

A record's value is the magic byte 0, the writer schema's id (4 bytes, big-endian), the
message indexes (which message of the schema file) and the Protobuf body. The batch's
schemas are fixed at step 2 as Avro's are (:func:`pipelines.subjects.plan`): the subject's
versions after the LSO snapshot, the newest as the reader. The table's columns are the
reader message's fields (``message``, default the newest version's first message), in its
order; :func:`columns` maps their types. Each record is parsed with its writer's descriptor
and read into the reader's message by field number, as Protobuf resolves versions itself: a
field the writer lacks takes the reader's default (null where the field has presence: a
message, ``optional``, a oneof member), a field the reader lacks is dropped, an int32 read
into an int64 column widens. The table follows the reader through schema evolution
(:mod:`pipelines.evolution`), in the batch's own commit, as an Avro pipeline's does.

The decode is Tidemark's JVM expression ``tidemark_from_protobuf`` (``infra/java``): the
driver compiles each version's ``.proto`` once (:mod:`connectors.protobuf_schemas`) and
hands the descriptors to it as constants. Quarantined, with the reason: a value not in the
framing, an id that is not a version of the subject, message indexes that name no message
or another message than the pipeline's, a body that does not parse, a field whose writer
type does not read as its column's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectors.protobuf_schemas import compile_schema, message
from connectors.registry import Registry
from offsets.ledger import Schemas
from pipelines.subjects import framed_decode, schema_text
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

#: Nested messages deeper than this stop with a clear line (a recursive message has no end).
MAX_DEPTH = 32


def compiled(registry: Registry, schema_id: int, subject: str) -> bytes:
    """Schema ``schema_id``'s descriptors (``connectors.protobuf_schemas.compile_schema``), with the
    files its schema references name."""
    text = schema_text(registry, schema_id, subject)
    return compile_schema(text, f"schema id {schema_id} of subject {subject!r}", registry.imports(schema_id))


def reader_message(registry: Registry, schemas: Schemas, pipeline: PipelineConfig) -> Descriptor:
    """The message the table's columns follow, in the batch's reader schema."""
    return message(compiled(registry, schemas.reader, schemas.subject), pipeline.message,
                   f"schema id {schemas.reader} of subject {schemas.subject!r}")


def columns(descriptor: Descriptor, depth: int = 0) -> StructType:
    """The Spark columns of a message's fields, in its order (``tidemark_from_protobuf`` reads
    field ``i`` into column ``i``): int32 kinds as int, int64 and uint32 kinds as bigint (a uint64
    over 2^63 wraps negative, as spark-protobuf's), enums as their value's name, bytes as binary,
    ``google.protobuf.Timestamp`` as timestamp, messages as structs, repeated as arrays, maps as maps."""
    from pyspark.sql.types import StructField, StructType

    if depth > MAX_DEPTH:
        raise ConfigError(f"message {descriptor.full_name} nests deeper than {MAX_DEPTH} levels (a recursive "
                          "message?); a table cannot hold it as columns: use format: raw")
    return StructType([StructField(f.name, _column_type(f, depth)) for f in descriptor.fields])


def _column_type(field: FieldDescriptor, depth: int) -> DataType:
    from pyspark.sql.types import ArrayType, MapType

    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry = field.message_type
        return MapType(_element_type(entry.fields_by_name["key"], depth + 1),
                       _element_type(entry.fields_by_name["value"], depth + 1))
    element = _element_type(field, depth)
    return ArrayType(element) if field.is_repeated else element


def _element_type(field: FieldDescriptor, depth: int) -> DataType:
    from pyspark.sql import types as T

    if field.message_type is not None:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return T.TimestampType()
        return columns(field.message_type, depth + 1)
    kinds: dict[int, DataType] = {
        field.TYPE_INT32: T.IntegerType(), field.TYPE_SINT32: T.IntegerType(), field.TYPE_SFIXED32: T.IntegerType(),
        field.TYPE_INT64: T.LongType(), field.TYPE_SINT64: T.LongType(), field.TYPE_SFIXED64: T.LongType(),
        field.TYPE_UINT32: T.LongType(), field.TYPE_FIXED32: T.LongType(),
        field.TYPE_UINT64: T.LongType(), field.TYPE_FIXED64: T.LongType(),
        field.TYPE_FLOAT: T.FloatType(), field.TYPE_DOUBLE: T.DoubleType(), field.TYPE_BOOL: T.BooleanType(),
        field.TYPE_STRING: T.StringType(), field.TYPE_BYTES: T.BinaryType(), field.TYPE_ENUM: T.StringType(),
    }
    found = kinds.get(field.type)
    if found is None:
        raise ConfigError(f"field {field.full_name} has a Protobuf type Tidemark does not map to a column "
                          f"(type {field.type}); use format: raw")
    return found


def decode_columns(registry: Registry, schemas: Schemas, pipeline: PipelineConfig) -> tuple[Column, Column, list[str]]:
    """``(parsed, error, fields)``: the decoded struct, the quarantine reason (null if good), and the
    reader message's field names (the payload's columns)."""
    from pyspark.sql import functions as F

    reader = reader_message(registry, schemas, pipeline)
    payload = columns(reader)
    clash = [f.name for f in payload.fields if f.name.startswith("_tidemark_")]
    if clash:
        raise ConfigError(f"message {reader.full_name}'s field(s) {', '.join(clash)} start with `_tidemark_`, which "
                          "Tidemark keeps for its own columns")
    writers = {w: bytearray(compiled(registry, w, schemas.subject)) for w in schemas.writers}
    parsed, error = framed_decode("tidemark_from_protobuf", payload, writers, F.lit(reader.full_name),
                                  F.lit(schemas.reader), F.lit(schemas.subject))
    return parsed, error, [f.name for f in payload.fields]
