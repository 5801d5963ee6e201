"""``tidemark check``: Great Expectations suites over a pipeline's Delta table, and their Data Docs.

Three suites, each validated by a GX checkpoint on a Spark DataFrame (GX's Spark data
source) whose results also build the Data Docs site:

* **table** (the target at its current version): event id unique; (topic, partition,
  offset) unique; Kafka keys not null; the columns the pipeline's schema gives (JSON: its
  ``schema``; Avro: the reader schema of the newest batch) — exactly those under
  ``schema_evolution: strict``; under ``additive`` at least those, as fields a schema no
  longer has keep their columns;
* **transactions** (:func:`quality.facts.transactions`): every source transaction
  complete (G3), including the ones a timeout released;
* **reconciliation** (:func:`quality.facts.reconciliation`): per partition, Kafka's
  committed records equal table rows plus quarantine rows.

The GX project lives in ``<docs_dir>/gx`` (a file data context), so results accumulate
and the site shows every run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.dedup import EVENT_ID_COLUMN
from pipelines.transactions.headers import TXN_COLUMN
from quality import facts
from tidemark.config import PipelineConfig, TidemarkConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from connectors.registry import Registry
    from offsets.ledger import Intent

LINEAGE_NAMES = {"topic": "_kafka_topic", "partition": "_kafka_partition", "offset": "_kafka_offset",
                 "timestamp": "_kafka_timestamp", "key": "_kafka_key", "headers": "_kafka_headers",
                 "batch_id": "_tidemark_batch_id"}


@dataclass(frozen=True)
class Verdict:
    suite: str
    check: str
    passed: bool
    observed: str


@dataclass(frozen=True)
class AuditReport:
    pipeline: str
    verdicts: tuple[Verdict, ...]
    docs: Path
    """The Data Docs site's index.html."""
    skipped: tuple[str, ...] = ()
    """Ranges operators' seeks passed over (``tidemark offsets seek --skip``): reconciled as skipped, not missing."""

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)


TXN_FIELDS = ("id", "position", "size", "expected", "released")


def expected_columns(pipeline: PipelineConfig, reader: str | None = None) -> list[str]:
    """The table's columns as GX's Spark source lists them: struct fields also as ``a.b``.
    ``reader``: an Avro or Protobuf pipeline's reader schema (its text), whose fields are its payload's."""
    from pyspark.sql.types import StructType

    def flat(schema: StructType, prefix: str = "") -> list[str]:
        names = []
        for f in schema.fields:
            names.append(prefix + f.name)
            if isinstance(f.dataType, StructType):
                names += flat(f.dataType, f"{prefix}{f.name}.")
        return names

    if pipeline.format == "avro":
        payload = avro_columns(json.loads(reader)) if reader is not None else []
    elif pipeline.format == "protobuf":
        payload = flat(protobuf_columns(pipeline, reader)) if reader is not None else []
    else:
        declared = StructType.fromDDL(pipeline.schema_ddl or "")
        payload = flat(declared) if pipeline.format == "json" and isinstance(declared, StructType) else ["value"]
    extra = [EVENT_ID_COLUMN]
    if pipeline.transactions.atomic:
        extra += [TXN_COLUMN, *(f"{TXN_COLUMN}.{f}" for f in TXN_FIELDS)]
    return [*payload, *(LINEAGE_NAMES[c] for c in pipeline.lineage), *extra, "_tidemark_ingested_at"]


def avro_columns(schema: Any, prefix: str = "") -> list[str]:
    """An Avro record's fields as the columns spark-avro decodes it into (a record, also inside
    a union with null, is a struct whose fields are listed too)."""
    names = []
    for field in schema.get("fields", []):
        names.append(prefix + field["name"])
        kind = field["type"]
        if isinstance(kind, list):
            branches = [b for b in kind if b != "null"]
            kind = branches[0] if len(branches) == 1 else None
        if isinstance(kind, dict) and kind.get("type") == "record":
            names += avro_columns(kind, f"{prefix}{field['name']}.")
    return names


def protobuf_columns(pipeline: PipelineConfig, reader: str) -> StructType:
    """A Protobuf pipeline's payload columns: its message's fields in the reader schema (``.proto`` text)."""
    from connectors.protobuf_schemas import compile_schema, message
    from pipelines.protobuf import columns

    what = f"the reader schema of pipeline {pipeline.name!r}"
    return columns(message(compile_schema(reader, what), pipeline.message, what))


def expected_payload(spark: SparkSession, pipeline: PipelineConfig, reader: str | None) -> StructType | None:
    """The pipeline's payload columns with their types (None for a registry's format before its
    first batch): JSON's ``schema``; Avro's reader as spark-avro decodes it; Protobuf's message."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    if pipeline.format == "json":
        declared = StructType.fromDDL(pipeline.schema_ddl or "")
        return declared if isinstance(declared, StructType) else None
    if pipeline.format == "raw":
        return StructType([StructField("value", BinaryType())])
    if reader is None:
        return None
    if pipeline.format == "protobuf":
        return protobuf_columns(pipeline, reader)
    from pipelines.avro import reader_columns

    return reader_columns(spark, reader)


def registry_of(config: TidemarkConfig, pipeline: PipelineConfig) -> Registry | None:
    """The schema registry an Avro or Protobuf pipeline's check reads its reader schema from."""
    if not pipeline.uses_registry:
        return None
    from connectors.registry import Registry
    from tidemark.settings import load_settings

    return Registry(config.schema_registry, load_settings())


def reader_schema(pipeline: PipelineConfig, intents: list[Intent], registry: Registry | None) -> str | None:
    """An Avro or Protobuf pipeline's reader schema: its newest batch's (None before any batch decoded one)."""
    if not pipeline.uses_registry:
        return None
    from pipelines.subjects import schema_text
    from tidemark.errors import ConfigError

    newest = next((i.schemas for i in reversed(intents) if i.schemas is not None), None)
    if newest is None:
        return None
    if registry is None:
        raise ConfigError(f"pipeline {pipeline.name!r} reads {pipeline.format}: its check needs the schema registry "
                          "(schema_registry in the config)")
    return schema_text(registry, newest.reader, newest.subject)


#: The lineage suite's one column: a record's topic, partition and offset as one string.
RECORD_COLUMN = "kafka_record"


def _has_record_lineage(pipeline: PipelineConfig) -> bool:
    return {"topic", "partition", "offset"} <= set(pipeline.lineage)


def _suites(pipeline: PipelineConfig, reader: str | None = None, *,
            typed: bool = False) -> dict[str, list[tuple[str, Any]]]:
    """Each suite's checks; ``typed``: the pipeline's column types are known (a ``schema`` suite)."""
    import great_expectations.expectations as gxe

    strict = pipeline.schema_evolution == "strict"
    table: list[tuple[str, Any]] = [
        ("event id unique", gxe.ExpectColumnValuesToBeUnique(column=EVENT_ID_COLUMN)),
        ("columns match the pipeline's schema" if strict else "columns include the pipeline's schema",
         gxe.ExpectTableColumnsToMatchSet(column_set=expected_columns(pipeline, reader), exact_match=strict)),
    ]
    if "key" in pipeline.lineage:
        table.append(("Kafka keys not null", gxe.ExpectColumnValuesToNotBeNull(column="_kafka_key")))
    suites = {"table": table}
    if typed:
        suites["schema"] = [("column types are the pipeline's schema's" if strict
                             else "column types hold the pipeline's schema's",
                             gxe.ExpectColumnValuesToBeNull(column="problem"))]
    if _has_record_lineage(pipeline):
        # One column, not ExpectCompoundColumnsToBeUnique: GX's Spark metric for that puts a
        # window function in a WHERE clause, which Spark rejects (a logged stack trace) before
        # GX falls back to another plan.
        suites["lineage"] = [("(topic, partition, offset) unique",
                              gxe.ExpectColumnValuesToBeUnique(column=RECORD_COLUMN))]
    if pipeline.transactions.atomic:
        suites["transactions"] = [("every source transaction complete",
                                   gxe.ExpectColumnValuesToBeNull(column="problem"))]
    suites["reconciliation"] = [("Kafka records = table rows + quarantine rows",
                                 gxe.ExpectColumnValuesToBeBetween(column="difference", min_value=0, max_value=0))]
    return suites


def _observed(result: Any) -> str:
    """A short human account of one expectation result."""
    details = result.result or {}
    if "unexpected_count" in details:
        sample = details.get("partial_unexpected_list") or []
        shown = "; ".join(str(s) for s in sample[:3])
        return f"{details['unexpected_count']} unexpected" + (f" (e.g. {shown})" if shown else "")
    observed = details.get("observed_value")
    if isinstance(observed, list) and not result.success:
        mismatch = details.get("details", {}).get("mismatched") or {}
        return f"columns differ: {mismatch}" if mismatch else f"columns: {observed}"
    return "ok" if result.success else str(observed)


def audit(spark: SparkSession, pipeline: PipelineConfig, *, kafka_options: dict[str, str],
          client_config: dict[str, str], docs_dir: Path, registry: Registry | None = None) -> AuditReport:
    """Validate the pipeline's table with GX, update the Data Docs, return the verdicts
    (``registry``: an Avro pipeline's, for its reader schema)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no usage statistics leave the machine
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    from offsets.tables import delta_table_exists
    from tidemark.errors import ConfigError

    if not delta_table_exists(spark, pipeline.target):
        raise ConfigError(f"pipeline {pipeline.name!r} has no table at {pipeline.target} yet; "
                          f"run `tidemark ingest {pipeline.name}` first")
    table = spark.read.format("delta").load(pipeline.target)
    frames: dict[str, DataFrame] = {"table": table}
    if _has_record_lineage(pipeline):
        from pyspark.sql import functions as F

        frames["lineage"] = table.select(F.concat_ws("/", "_kafka_topic", "_kafka_partition", "_kafka_offset")
                                         .alias(RECORD_COLUMN))
    if pipeline.transactions.atomic:
        frames["transactions"] = facts.transactions(table)
    from offsets.ledger import Ledger

    intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    frames["reconciliation"] = facts.reconciliation(spark, kafka_options, client_config, pipeline, intents)
    reader = reader_schema(pipeline, intents, registry)
    payload = expected_payload(spark, pipeline, reader)
    if payload is not None:
        frames["schema"] = facts.column_types(spark, table.schema, payload, pipeline.schema_evolution == "strict")
    skipped = tuple(f"{r.topic}[{r.partition}] {r.start}-{r.end} (batch {batch}, {reason})"
                    for batch, r, reason in facts.skipped(intents))

    docs_dir.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(docs_dir))
    # No tqdm bars: the CLI prints one line per step, and a bar per metric batch is noise in logs.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_or_update_spark(name="tidemark")
    verdicts: list[Verdict] = []
    for suite_name, checks in _suites(pipeline, reader, typed=payload is not None).items():
        name = f"{pipeline.name}.{suite_name}"
        try:
            asset = source.get_asset(name)
        except LookupError:
            asset = source.add_dataframe_asset(name=name)
        try:
            batch = asset.get_batch_definition("whole")
        except (KeyError, LookupError):
            batch = asset.add_batch_definition_whole_dataframe("whole")
        suite = context.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=[c for _, c in checks]))
        definition = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=batch, suite=suite))
        checkpoint = context.checkpoints.add_or_update(gx.Checkpoint(
            name=name, validation_definitions=[definition], result_format="SUMMARY",
            actions=[UpdateDataDocsAction(name="data_docs")]))
        run = checkpoint.run(batch_parameters={"dataframe": frames[suite_name].cache()})
        results = next(iter(run.run_results.values())).results
        for (label, _), result in zip(checks, results, strict=True):
            verdicts.append(Verdict(suite_name, label, bool(result.success), _observed(result)))
        frames[suite_name].unpersist()
    context.build_data_docs()
    index = docs_dir / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    report = AuditReport(pipeline.name, tuple(verdicts), index, skipped)
    _record_last(report, docs_dir)
    return report


def _last_path(docs_dir: Path, pipeline: str) -> Path:
    return docs_dir / "verdicts" / f"{pipeline}.json"


def _record_last(report: AuditReport, docs_dir: Path) -> None:
    """Keep the newest verdict where ``tidemark status`` finds it without running GX again."""
    path = _last_path(docs_dir, report.pipeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    failed = [f"{v.suite}: {v.check}" for v in report.verdicts if not v.passed]
    record = {"pipeline": report.pipeline, "at": datetime.now(UTC).isoformat(timespec="seconds"),
              "passed": report.passed, "checks": len(report.verdicts), "failed": failed, "docs": str(report.docs)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)  # readers never see half a record


def last_verdict(docs_dir: Path, pipeline: str) -> dict[str, Any] | None:
    """The newest audit's verdict of ``pipeline`` (as written by :func:`audit`), or None."""
    path = _last_path(docs_dir, pipeline)
    return json.loads(path.read_text()) if path.exists() else None
