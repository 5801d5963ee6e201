"""The schemas a registry-decoded batch (``format: avro`` or ``protobuf``) is planned with.

Step 2 fixes them in the batch's intent (``offsets.ledger.Schemas``): the versions of the
pipeline's subject and of its topics' own subjects (``<topic>-value``, the subjects producers
and the relay write with under Confluent's TopicNameStrategy), read after the batch's LSO
snapshot, are every schema a record of the batch can have been written with (a record's id
that is not among them is not one of theirs), and the newest version of the pipeline's
subject is the reader schema the table's columns follow. So one pipeline reads several topics
whose producers each register under their topic's subject. A replay after a crash decodes
with the same ids, and an id never changes what it names in a registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from connectors.registry import Registry
from offsets.ledger import Schemas
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError, RegistryUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

#: The last field of a JVM decoder's struct (``tidemark_from_avro``, ``tidemark_from_protobuf``):
#: why the value did not decode, null when it did.
DECODE_ERROR = "_tidemark_error"


def plan(registry: Registry, pipeline: PipelineConfig, topics: Iterable[str] = ()) -> Schemas:
    """The schemas of a batch of ``topics`` planned now (call it after the batch's LSO snapshot):
    the subject's version ids in order, then those of the topics' own subjects not among them."""
    subject = pipeline.registry_subject
    versions = registry.versions(subject)
    if not versions:
        raise ConfigError(f"pipeline {pipeline.name!r}: subject {subject!r} has no versions in the schema registry "
                          f"at {registry.url}: register the topic's schema there, or set `subject` to the one its "
                          "producers use. Nothing was read")
    writers = [v.schema_id for v in versions]
    for own in sorted({f"{topic}-value" for topic in topics} - {subject}):
        writers += sorted({v.schema_id for v in registry.versions(own)} - set(writers))
    return Schemas(subject, tuple(writers), versions[-1].schema_id)


def schema_text(registry: Registry, schema_id: int, subject: str) -> str:
    found = registry.schema(schema_id)
    if found is None:  # a version's id the registry itself listed: deleted since. A follower waits for it
        raise RegistryUnavailableError(f"schema id {schema_id} of subject {subject!r} is no longer in the registry "
                                       f"at {registry.url}; restore it (a batch planned with it must decode with it)")
    return found


def framed_decode(function: str, payload: StructType, writers: Mapping[int, object],
                  *constants: Column) -> tuple[Column, Column]:
    """A JVM decoder of Confluent-framed values over the Kafka value, called as
    ``function(value, writers, *constants, schema)``: its struct (``payload``'s columns, then
    :data:`DECODE_ERROR`) and the record's quarantine reason (a tombstone's, or the decoder's)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField
    from pyspark.sql.types import StructType as Struct

    result = Struct([*payload.fields, StructField(DECODE_ERROR, StringType())])
    by_id = F.create_map(*(c for schema_id, writer in writers.items() for c in (F.lit(schema_id), F.lit(writer))))
    parsed = F.call_function(function, F.col("value"), by_id, *constants, F.lit(result.json()))
    return parsed, F.when(F.col("value").isNull(), F.lit("tombstone: null value")).otherwise(parsed[DECODE_ERROR])
