"""The schemas a registry-decoded batch (``format: avro`` or ``protobuf``) is planned with.

Step 2 fixes them in the batch's intent (``offsets.ledger.Schemas``): the subject's versions,
read after the batch's LSO snapshot, are every schema a record of the batch can have been
written with (a record's id that is not among them is not a version of the subject), and the
newest is the reader schema the table's columns follow. A replay after a crash decodes with
the same ids, and an id never changes what it names in a registry.
"""

from __future__ import annotations

from connectors.registry import Registry
from offsets.ledger import Schemas
from tidemark.config import PipelineConfig
from tidemark.errors import ConfigError, RegistryUnavailableError


def plan(registry: Registry, pipeline: PipelineConfig) -> Schemas:
    """The schemas of a batch planned now (call it after the batch's LSO snapshot)."""
    subject = pipeline.registry_subject
    versions = registry.versions(subject)
    if not versions:
        raise ConfigError(f"pipeline {pipeline.name!r}: subject {subject!r} has no versions in the schema registry "
                          f"at {registry.url}: register the topic's schema there, or set `subject` to the one its "
                          "producers use. Nothing was read")
    return Schemas(subject, tuple(v.schema_id for v in versions), versions[-1].schema_id)


def schema_text(registry: Registry, schema_id: int, subject: str) -> str:
    found = registry.schema(schema_id)
    if found is None:  # a version's id the registry itself listed: deleted since. A follower waits for it
        raise RegistryUnavailableError(f"schema id {schema_id} of subject {subject!r} is no longer in the registry "
                                       f"at {registry.url}; restore it (a batch planned with it must decode with it)")
    return found
