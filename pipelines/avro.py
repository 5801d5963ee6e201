"""``format: avro``: Confluent-framed Avro, each record decoded with its own writer schema.

A record's value is the magic byte 0, the writer schema's id (4 bytes, big-endian) and the
Avro body. Step 2 fixes the batch's schemas (:func:`pipelines.subjects.plan`): the subject's versions, read
after the batch's LSO snapshot, are every schema a record of the batch can have been
written with; the newest is the reader schema, into which Avro's schema resolution reads
every record (a field a writer lacks takes its default; an int read as a long widens). The
table's columns are the reader's fields as spark-avro's ``from_avro`` types them, so a new
version's field or widening reaches the table through schema evolution
(:mod:`pipelines.evolution`), in the batch's own commit.

Two decoders give the same rows. Tidemark's JVM expression ``tidemark_from_avro`` reads each
value once, straight into the row, with Avro's resolving decoder; it takes readers made of
records, unions of one type with null, primitives, enums, fixed, arrays, maps, dates,
timestamps and decimals (:func:`direct`). Any other reader, or a session without the
expression, goes to Spark's ``from_avro``, one branch per writer id: its reader schema gets
one field of Tidemark's, absent from every writer and so always its default (true), unless
the body does not decode: ``from_avro`` then returns a struct of nulls, and the null marker
is how a bad body is told from a record whose fields are all null.
Quarantined, with the reason: a value that is not framed (no magic byte 0, shorter than the
frame), an id that is not a version of the subject, a body that does not decode.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from connectors.registry import Registry
from offsets.ledger import Schemas
from pipelines.subjects import framed_decode, schema_text
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import StructType

#: The reader schema's own field (``from_avro``): true after a decode, null when the body did not decode.
DECODED = "_tidemark_decoded"


def reader_with_marker(reader: str) -> str:
    """The reader schema with :data:`DECODED` added (boolean, default true)."""
    schema = json.loads(reader)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("format avro needs record schemas (a table's columns are a record's fields); "
                          f"the subject's newest version is {str(reader)[:80]}")
    fields = [f for f in schema.get("fields", []) if f.get("name") != DECODED]
    return json.dumps({**schema, "fields": [*fields, {"name": DECODED, "type": "boolean", "default": True}]})


#: Avro's primitive type names and the logical types the direct decoder reads as from_avro does.
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_LOGICAL = {None, "date", "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
            "local-timestamp-micros", "decimal", "uuid"}


def direct(schema: Any) -> bool:
    """Can ``tidemark_from_avro`` read into this (parsed JSON) schema? (Else ``from_avro`` does.)"""
    if isinstance(schema, str):
        return schema in _PRIMITIVES
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return len(branches) == 1 and len(schema) <= 2 and direct(branches[0])
    if not isinstance(schema, dict) or schema.get("logicalType") not in _LOGICAL:
        return False
    kind = schema.get("type")
    if kind == "record":
        return all(direct(f.get("type")) for f in schema.get("fields", []))
    if kind == "array":
        return direct(schema.get("items"))
    if kind == "map":
        return direct(schema.get("values"))
    return kind in ("enum", "fixed") or kind in _PRIMITIVES


def decode_columns(spark: SparkSession, registry: Registry, schemas: Schemas) -> tuple[Column, Column, list[str]]:
    """``(parsed, error, fields)``: the decoded struct, the quarantine reason (null if good), and the
    reader's field names (the payload's columns)."""
    from pyspark.sql import functions as F

    reader = schema_text(registry, schemas.reader, schemas.subject)
    marked = reader_with_marker(reader)  # also checks that the reader is a record
    fields = [f["name"] for f in json.loads(reader)["fields"]]
    writers = {w: schema_text(registry, w, schemas.subject) for w in schemas.writers}
    if spark.catalog.functionExists("tidemark_from_avro") and direct(json.loads(reader)):
        return (*_direct_columns(spark, reader, writers, schemas.subject), fields)
    value = F.col("value")
    framed = (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(bytearray(b"\x00")))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
    parsed, error = _from_avro_columns(marked, writers, schemas.subject, framed, schema_id)
    return parsed, error, fields


def reader_columns(spark: SparkSession, reader: str) -> StructType:
    """The columns ``from_avro`` makes of a reader schema (analysed, no job run): both decoders'
    rows, and what the quality suite's type check wants."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.types import StructType

    typed = spark.range(0).select(from_avro(F.lit(None).cast("binary"), reader).alias("p")).schema["p"].dataType
    if not isinstance(typed, StructType):
        raise ConfigError(f"format avro needs record schemas (a table's columns are a record's fields); the reader "
                          f"schema is {reader[:80]}")
    return typed


def _direct_columns(spark: SparkSession, reader: str, writers: dict[int, str], subject: str) -> tuple[Column, Column]:
    from pyspark.sql import functions as F

    return framed_decode("tidemark_from_avro", reader_columns(spark, reader), writers, F.lit(reader), F.lit(subject))


def _from_avro_columns(reader: str, writers: dict[int, str], subject: str, framed: Column,
                       schema_id: Column) -> tuple[Column, Column]:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    value = F.col("value")
    options = {"mode": "PERMISSIVE", "avroSchema": reader}
    body = F.expr("substring(value, 6, 2147483647)")
    parsed: Any = None
    for writer, text in writers.items():
        branch = from_avro(body, text, options)
        parsed = (F.when if parsed is None else parsed.when)(framed & (schema_id == writer), branch)
    known = schema_id.isin(*writers)
    error = (F.when(value.isNull(), F.lit("tombstone: null value"))
             .when(~framed, F.lit("not Confluent-framed Avro: no magic byte 0 and 4-byte schema id"))
             .when(~known, F.concat(F.lit("unknown schema id "), schema_id.cast("string"),
                                    F.lit(f" (not a version of subject {subject} in the registry)")))
             .when(parsed[DECODED].isNull(), F.concat(F.lit("value does not decode as Avro with schema id "),
                                                      schema_id.cast("string"))))
    return parsed, error
