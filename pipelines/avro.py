"""``format: avro``: Confluent-framed Avro, each record decoded with its own writer schema.

A record's value is the magic byte 0, the writer schema's id (4 bytes, big-endian) and the
Avro body. Step 2 fixes the batch's schemas (:func:`pipelines.subjects.plan`): the subject's versions, read
after the batch's LSO snapshot, are every schema a record of the batch can have been
written with; the newest is the reader schema, into which Avro's schema resolution reads
every record (a field a writer lacks takes its default; an int read as a long widens). The
table's columns are the reader's fields, so a new version's field or widening reaches the
table through schema evolution (:mod:`pipelines.evolution`), in the batch's own commit.

The decode is Spark's ``from_avro`` (spark-avro), one branch per writer id. The reader
schema gets one field of Tidemark's, absent from every writer and so always its default
(true), unless the body does not decode: ``from_avro`` then returns a struct of nulls, and
the null marker is how a bad body is told from a record whose fields are all null.
Quarantined, with the reason: a value that is not framed (no magic byte 0, shorter than the
frame), an id that is not a version of the subject, a body that does not decode.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from connectors.registry import Registry
from offsets.ledger import Schemas
from pipelines.subjects import schema_text
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column

#: The reader schema's own field: true after a decode, null when the body did not decode.
DECODED = "_tidemark_decoded"


def reader_with_marker(reader: str) -> str:
    """The reader schema with :data:`DECODED` added (boolean, default true)."""
    schema = json.loads(reader)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("format avro needs record schemas (a table's columns are a record's fields); "
                          f"the subject's newest version is {str(reader)[:80]}")
    fields = [f for f in schema.get("fields", []) if f.get("name") != DECODED]
    return json.dumps({**schema, "fields": [*fields, {"name": DECODED, "type": "boolean", "default": True}]})


def decode_columns(registry: Registry, schemas: Schemas) -> tuple[Column, Column, list[str]]:
    """``(parsed, error, fields)``: the decoded struct, the quarantine reason (null if good), and the
    reader's field names (the payload's columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader = reader_with_marker(schema_text(registry, schemas.reader, schemas.subject))
    options = {"mode": "PERMISSIVE", "avroSchema": reader}
    value = F.col("value")
    framed = (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(bytearray(b"\x00")))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
    body = F.expr("substring(value, 6, 2147483647)")
    parsed: Any = None
    for writer in schemas.writers:
        branch = from_avro(body, schema_text(registry, writer, schemas.subject), options)
        parsed = (F.when if parsed is None else parsed.when)(framed & (schema_id == writer), branch)
    known = schema_id.isin(*schemas.writers)
    error = (F.when(value.isNull(), F.lit("tombstone: null value"))
             .when(~framed, F.lit("not Confluent-framed Avro: no magic byte 0 and 4-byte schema id"))
             .when(~known, F.concat(F.lit("unknown schema id "), schema_id.cast("string"),
                                    F.lit(f" (not a version of subject {schemas.subject} in the registry)")))
             .when(parsed[DECODED].isNull(), F.concat(F.lit("value does not decode as Avro with schema id "),
                                                      schema_id.cast("string"))))
    fields = [f["name"] for f in json.loads(reader)["fields"] if f["name"] != DECODED]
    return parsed, error, fields
