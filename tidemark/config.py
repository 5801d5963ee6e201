"""``tidemark.yaml``: the Kafka connection and the pipelines, as typed, frozen models.

A pipeline reads source topics (a list or a regex pattern) into one Delta table.
Validation errors name the field path and what to write instead, e.g.
``pipelines[0].start: expected 'earliest', 'latest' or {timestamp: ...}``.
Secrets (SASL password, TLS key password) are SecretStr and never printed.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tidemark.errors import ConfigError

_MODEL = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

PipelineName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_\-]{0,62}$")]
LineageColumn = Literal["topic", "partition", "offset", "timestamp", "key", "headers", "batch_id"]


def read_secret(owner: BaseModel, name: str, section: str) -> str | None:
    """Secret ``name`` of ``owner``, from wherever it is configured: in clear (``name``), a file
    (``name_file``) or an environment variable (``name_env``); read now, never cached, so a
    rotated file is seen. None if none of them is set. ``section`` names ``owner`` in errors."""
    value: SecretStr | None = getattr(owner, name)
    if value is not None:
        return value.get_secret_value()
    path: Path | None = getattr(owner, f"{name}_file")
    if path is not None:
        try:
            return path.expanduser().read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{section}.{name}_file: cannot read {path} ({exc.strerror}); "
                              "fix the path or the file's permissions") from None
    env: str | None = getattr(owner, f"{name}_env")
    if env is not None:
        if env not in os.environ:
            raise ConfigError(f"{section}.{name}_env names {env}, which is not set; "
                              f"export {env} before running Tidemark")
        return os.environ[env]
    return None


def _one_source(owner: BaseModel, name: str) -> None:
    """At most one of ``name``, ``name_file`` and ``name_env`` is given."""
    given = [n for n in (name, f"{name}_file", f"{name}_env") if getattr(owner, n) is not None]
    if len(given) > 1:
        raise ValueError(f"give one of {', '.join(given)}, not several")


class KafkaSecurity(BaseModel):
    """How every client (relay, admin, scans, Spark's Kafka source) authenticates to Kafka.

    Secrets never need to be in ``tidemark.yaml`` in clear: each may instead be read from
    a file (``*_file``, e.g. a mounted Kubernetes secret) or an environment variable
    (``*_env``, its name), at the moment a client is configured, so a rotated file is
    picked up by the next run without a config change.
    """

    model_config = _MODEL

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """``security.protocol`` for both librdkafka and Spark's Kafka client."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    """A file holding the SASL password (one line; surrounding whitespace ignored)."""
    sasl_password_env: str | None = None
    """The name of an environment variable holding the SASL password."""
    ssl_ca_location: Path | None = None
    """PEM file of the CA that signed the brokers' certificates (default: the system's CAs)."""
    ssl_certificate_location: Path | None = None
    """PEM client certificate (chain) for mutual TLS; needs ``ssl_key_location``."""
    ssl_key_location: Path | None = None
    """PEM private key of the client certificate (PKCS#8 or traditional, encrypted or not)."""
    ssl_key_password: SecretStr | None = None
    ssl_key_password_file: Path | None = None
    ssl_key_password_env: str | None = None
    ssl_verify_hostname: bool = True
    """Check that the broker's certificate names the host connected to. Turn off only for a
    broker whose certificate cannot name its address, and know that TLS then no longer
    tells the broker from anyone holding a certificate from the same CA."""

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecurity:
        for name in ("sasl_password", "ssl_key_password"):
            _one_source(self, name)
        if self.protocol.startswith("SASL"):
            missing = [n for n in ("sasl_mechanism", "sasl_username") if getattr(self, n) is None]
            if not (self.sasl_password or self.sasl_password_file or self.sasl_password_env):
                missing.append("sasl_password (or sasl_password_file, sasl_password_env)")
            if missing:
                raise ValueError(f"protocol {self.protocol} needs {', '.join(missing)}")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("mutual TLS needs both ssl_certificate_location and ssl_key_location")
        if self.ssl_certificate_location is not None and not self.protocol.endswith("SSL"):
            raise ValueError(f"a client certificate needs protocol SSL or SASL_SSL, not {self.protocol}")
        return self

    def secret(self, name: str, *, required: bool = True) -> str | None:
        """The value of secret ``name`` (``sasl_password``, ``ssl_key_password``), from
        wherever it is configured; read now, never cached, so a rotated file is seen."""
        found = read_secret(self, name, "kafka.security")
        if found is None and required:
            raise ConfigError(f"kafka.security.{name} is not configured")
        return found


class SchemaRegistryConfig(BaseModel):
    """The schema registry ``format: avro`` pipelines decode with (Confluent's API: Confluent,
    Karapace, Apicurio's ``/apis/ccompat/v7``). Unset ``url``: the embedded registry
    (``TIDEMARK_REGISTRY__PORT``). The password, like Kafka's, may come from a file or the
    environment instead of this file."""

    model_config = _MODEL

    url: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password: SecretStr | None = None
    basic_auth_password_file: Path | None = None
    basic_auth_password_env: str | None = None
    ssl_ca_location: Path | None = None
    """PEM file of the CA that signed the registry's certificate (default: the system's CAs)."""
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None

    @model_validator(mode="after")
    def _complete(self) -> SchemaRegistryConfig:
        _one_source(self, "basic_auth_password")
        given = any(getattr(self, n) is not None
                    for n in ("basic_auth_password", "basic_auth_password_file", "basic_auth_password_env"))
        if given and self.basic_auth_username is None:
            raise ValueError("a basic auth password needs basic_auth_username")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("mutual TLS needs both ssl_certificate_location and ssl_key_location")
        return self

    def password(self) -> str | None:
        """The basic auth password, read now (a rotated file is seen), or None."""
        return read_secret(self, "basic_auth_password", "schema_registry")


class KafkaConnection(BaseModel):
    model_config = _MODEL

    bootstrap_servers: str | None = None
    """``host:port,...``; unset means the embedded broker (``TIDEMARK_KAFKA__*`` settings)."""
    security: KafkaSecurity = KafkaSecurity()


class TimestampStart(BaseModel):
    model_config = _MODEL

    timestamp: datetime
    """Start each partition at the first record at or after this time (ISO 8601, with zone)."""

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("give a time zone, e.g. 2026-01-31T00:00:00Z")
        return value


class TransactionsConfig(BaseModel):
    """Source-transaction atomicity (G3), from the relay's ``tidemark.*`` headers."""

    model_config = _MODEL

    atomic: bool = True
    """Cut each batch so a source transaction's events for this pipeline's topics land in one commit."""
    incomplete_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    """How long a transaction may miss events that are not readable (not below any LSO: never
    produced, deleted by retention, on a topic not read) before ``on_incomplete`` applies, counted
    from the first batch that found them missing, not from the events' age. Until then it, and
    everything after it in its partitions, waits. A transaction the record cap splits is never
    incomplete: it waits for a later batch, whatever its age."""
    on_incomplete: Literal["release", "stop"] = "release"
    """``release``: write what arrived, flagged ``_tidemark_txn.released``, and log an alert;
    ``stop``: fail the run with the transaction named, writing nothing of it."""
    manifest_topic: str | None = "tidemark.relay-manifest"
    """The relay's transaction manifest (``relay.manifest_topic``). Where it lists a batch's source
    transactions, the batch is cut from it, with no read of the records; its write is checked
    against any multi-event transaction it does not list. Null, or no such topic: the scan or
    the guard below decide."""
    scan: Literal["auto", "always"] = "auto"
    """How a batch is proved free of torn transactions. ``always``: a planning scan reads the
    batch's headers before it is written, and the cut is made from them. ``auto``: after a
    batch written this way, or (once a probe of each range's first records finds none) for a
    pipeline's first batch and after a scan that found no multi-event source transaction, the
    next is written uncut and unscanned, its write checking every record instead; the first
    record of a multi-event transaction aborts that write before its commit, and the batch is
    re-planned with the scan (docs/design.md, "G3 without a scan")."""


class DedupConfig(BaseModel):
    """Drop (to quarantine) a record whose event id the table already holds."""

    model_config = _MODEL

    window_days: Annotated[float, Field(gt=0)] = 7.0
    """Ids are looked up among rows ingested this many days before the batch (a bounded window)."""


class ScheduleConfig(BaseModel):
    """When ``tidemark serve`` runs this pipeline's flows (Prefect interval schedules)."""

    model_config = _MODEL

    ingest_every_seconds: Annotated[float, Field(ge=1)] | None = 60.0
    """A bounded ingest run (stored offsets up to the LSO) this often; null: no schedule."""
    audit_every_seconds: Annotated[float, Field(ge=10)] | None = 3600.0
    """The quality checks (``tidemark check``) this often; null: no schedule."""
    retries: Annotated[int, Field(ge=0, le=20)] = 3
    """Retries of a run's work after a *transient* error; terminal errors never retry."""
    retry_delay_seconds: Annotated[float, Field(ge=0)] = 10.0
    """Wait before the first retry; doubled for each next one."""
    wait_for_slot_seconds: Annotated[float, Field(ge=0)] = 600.0
    """How long a run waits for a rival run of the same pipeline before it is refused."""
    maintain_every_seconds: Annotated[float, Field(ge=60)] | None = 3600.0
    """``tidemark maintain`` (compaction, VACUUM) this often; null: no schedule. Hourly keeps a
    pipeline committing every 5 seconds below ~720 small files per table (docs/benchmarks.md,
    "Per-batch cost vs history")."""


#: New tables' ``delta.checkpointInterval`` is this many times ``maintenance.checkpoint_interval``:
#: Tidemark checkpoints them itself in between (``offsets.tables.checkpoint_if_due``).
SPARK_CHECKPOINT_FACTOR = 100


class MaintenanceConfig(BaseModel):
    """What ``tidemark maintain`` keeps, and the table properties new tables are created with."""

    model_config = _MODEL

    time_travel_hours: Annotated[float, Field(ge=0)] = 168.0
    """The promise: every version of the last this-many hours stays readable (time travel, and
    dedup's lookups when a stored batch is replayed or backfilled)."""
    vacuum_retain_hours: Annotated[float, Field(ge=0)] | None = None
    """VACUUM's retention; unset: ``time_travel_hours``. Never shorter than it (refused). Delta
    takes it from the table property ``delta.deletedFileRetentionDuration`` (VACUUM's own
    argument is ignored), which new tables are created with. Below the longest batch's
    duration, VACUUM may delete the files of a batch being written: under an hour only for
    tables nothing writes to meanwhile (maintain warns)."""
    zorder_by: tuple[str, ...] = ()
    """Target columns compaction clusters rows by (``OPTIMIZE ... ZORDER BY``); empty: bin-packing only."""
    checkpoint_interval: Annotated[int, Field(ge=1, le=1000)] = 10
    """Versions between checkpoints of each table (Delta's default interval). Tidemark writes them
    with delta-rs right after its own commits (tens of milliseconds); new tables get
    ``delta.checkpointInterval`` at 100 times this, so Spark's in-commit checkpoint, seconds
    long, comes rarely (``offsets.tables.checkpoint_if_due``)."""

    @model_validator(mode="after")
    def _retention_keeps_promise(self) -> MaintenanceConfig:
        if self.vacuum_retain_hours is not None and self.vacuum_retain_hours < self.time_travel_hours:
            raise ValueError(
                f"vacuum_retain_hours {self.vacuum_retain_hours:g} is shorter than time_travel_hours "
                f"{self.time_travel_hours:g}: VACUUM would delete files of versions the pipeline promises "
                "to keep readable. Raise vacuum_retain_hours, or lower time_travel_hours if the promise "
                "is too long")
        return self

    @property
    def retain_hours(self) -> float:
        return self.vacuum_retain_hours if self.vacuum_retain_hours is not None else self.time_travel_hours

    def table_properties(self) -> dict[str, str]:
        """Delta properties a new table is created with (``tidemark maintain --apply-properties``
        sets them on existing tables). Why each: docs/running.md, "Maintenance"."""
        return {"delta.deletedFileRetentionDuration": f"interval {self.retain_hours:g} hours",
                "delta.logRetentionDuration": f"interval {self.time_travel_hours:g} hours",
                "delta.checkpointInterval": str(self.checkpoint_interval * SPARK_CHECKPOINT_FACTOR)}


EventIdSource = Annotated[str, Field(pattern=r"^(header:.+|key|field:[A-Za-z_][A-Za-z0-9_]*)$")]


class PipelineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, populate_by_name=True)

    name: PipelineName
    """Identifies the pipeline's offsets and fences its writers; never rename a running pipeline."""
    topics: tuple[str, ...] = ()
    """Source topics, read under read_committed."""
    topic_pattern: str | None = None
    """Regex of source topics, instead of ``topics``; matching topics are picked up as they appear."""
    kafka_security: KafkaSecurity | None = None
    """This pipeline's own Kafka credentials (its ingest principal), instead of ``kafka.security``."""
    target: str
    """Delta table path (local path or object-store URI)."""
    quarantine: str | None = None
    """Delta table for records that fail parsing; default ``<target>_quarantine``."""
    format: Literal["json", "raw", "avro", "protobuf"] = "json"
    """``json``: parse values against ``schema``; ``raw``: keep value bytes as they are; ``avro``:
    Confluent-framed Avro, decoded with each record's writer schema from ``schema_registry``
    into the subject's newest version (``pipelines.avro``); ``protobuf``: Confluent-framed
    Protobuf, parsed with each record's writer schema and read into the newest version's
    message by field number (``pipelines.protobuf``)."""
    subject: str | None = None
    """``avro``, ``protobuf``: the registry subject whose newest version the table's columns follow
    (default ``<topic>-value``, Confluent's TopicNameStrategy, for a pipeline of one topic). Records
    may be written with any version of it or of their own topic's ``<topic>-value``, so a pipeline
    of several topics names the subject its table follows here."""
    message: str | None = None
    """``protobuf``: the full name of the message the table's columns follow (e.g.
    ``shop.Order``); default the first message of the subject's newest version."""
    schema_ddl: str | None = Field(default=None, alias="schema")
    """Spark DDL of the JSON payload, e.g. ``order_id STRING, amount DECIMAL(12,2)``."""
    schema_evolution: Literal["additive", "strict"] = "additive"
    """What a change of the batch's columns against the target's does (``pipelines.evolution``).
    ``additive``: a new field becomes a new column, a removed one stays (null from then on), a
    widening Delta makes by itself (int→bigint, float→double) widens the column if
    ``type_widening`` allows it, each in the batch's own commit; any other change stops the
    pipeline, writing nothing. ``strict``: any change stops it."""
    type_widening: Literal["refuse", "allow"] = "refuse"
    """``additive``: what a widening does. ``refuse``: stops the pipeline, writing nothing (its
    records wait in Kafka). ``allow``: widens the column, which turns on Delta's
    ``typeWidening`` reader feature: from then on the table's readers need delta-spark 4.0 or
    later, and delta-rs (Polars, DuckDB's delta reader) cannot read any version of it."""
    lineage: tuple[LineageColumn, ...] = ("topic", "partition", "offset", "timestamp", "key", "batch_id")
    """Kafka facts added as ``_kafka_<name>`` columns (``_tidemark_batch_id`` for batch_id)."""
    partition_by: tuple[str, ...] = ()
    """Delta partition columns of the target table."""
    start: Literal["earliest", "latest"] | TimestampStart = "earliest"
    """Where a new pipeline starts. Partitions and matching topics that appear later start at
    their log start: all of them is the running pipeline's to read."""
    max_records_per_batch: Annotated[int, Field(ge=1)] = 2_000_000
    """Cap on the offsets one batch spans (markers included, so records <= this).

    Rows stream from Kafka to Delta without being held in memory, so the cap bounds the
    work a crash may have to redo and how long rows wait to become visible, not memory.
    Each batch costs a few fixed Delta commits (about 2 s on 2 cores)."""
    max_bytes_per_batch: Annotated[ByteSize, Field(gt=0)] | None = None
    """Cap on the key, value and header bytes of one batch, e.g. ``512MiB`` or ``1GB``; unset: none.

    Kafka reports offsets, not bytes, so the planner estimates each partition's bytes per
    offset from the first records of its range (``connectors.sizes``): an approximate cap,
    which a single record larger than it exceeds (it goes alone). Applies with the record cap."""
    trigger_interval_seconds: Annotated[float, Field(gt=0)] = 10.0
    """``--follow``: time between micro-batches when caught up."""
    transactions: TransactionsConfig = TransactionsConfig()
    event_id: EventIdSource = "header:id"
    """Where a record's event id comes from (column ``_tidemark_event_id``): ``header:<name>``,
    ``key`` (the Kafka key as text) or ``field:<name>`` (a field of the JSON payload)."""
    dedup: DedupConfig | None = None
    """Unset: no dedup. Set (``dedup: {}`` for the defaults): a record whose event id is already in the
    batch or the table goes to quarantine as a duplicate, so counts still reconcile with Kafka."""
    schedule: ScheduleConfig = ScheduleConfig()
    """Orchestration: schedules, retries, and waiting for a rival run (``tidemark serve``)."""
    maintenance: MaintenanceConfig = MaintenanceConfig()
    """Compaction, VACUUM and the time-travel promise (``tidemark maintain``)."""

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("give exactly one of `topics` (a list) or `topic_pattern` (a regex)")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern is not a valid regex: {exc}") from None
        if self.format == "json" and not self.schema_ddl:
            raise ValueError("format json needs `schema` (Spark DDL), or use format: raw")
        if self.event_id.startswith("field:") and self.format == "raw":
            raise ValueError("event_id field:<name> needs format json, avro or protobuf; use header:<name> or key")
        if self.uses_registry:
            if self.schema_ddl:
                raise ValueError(f"format {self.format} takes its schema from the registry: remove `schema`")
            if self.subject is None and len(self.topics) != 1:
                raise ValueError(f"format {self.format} reads one subject: give `subject`, or read one topic "
                                 "(its subject is <topic>-value)")
        if self.message is not None and self.format != "protobuf":
            raise ValueError("`message` names a Protobuf message: it applies to format: protobuf")
        if self.type_widening == "allow" and self.schema_evolution == "strict":
            raise ValueError("type_widening: allow widens columns, which schema_evolution: strict never does: "
                             "set schema_evolution: additive, or remove type_widening")
        if self.transactions.atomic and not {"topic", "partition", "offset"} <= set(self.lineage):
            raise ValueError("transactions.atomic needs the topic, partition and offset lineage columns")
        return self

    @property
    def uses_registry(self) -> bool:
        """Are the records decoded with schemas from ``schema_registry`` (Avro, Protobuf)?"""
        return self.format in ("avro", "protobuf")

    @property
    def registry_subject(self) -> str:
        """The subject an ``avro`` or ``protobuf`` pipeline decodes with."""
        return self.subject or f"{self.topics[0]}-value"

    def in_scope(self, topic: str) -> bool:
        """Does this pipeline read ``topic``? (What a source transaction must deliver to it in full.)"""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics

    @property
    def quarantine_path(self) -> str:
        return self.quarantine or f"{self.target.rstrip('/')}_quarantine"

    @property
    def ledger_path(self) -> str:
        return f"{self.target.rstrip('/')}_tidemark_ledger"


class PostgresConnection(BaseModel):
    model_config = _MODEL

    dsn: SecretStr | None = None
    """libpq DSN of the application database; unset means the embedded server (``TIDEMARK_POSTGRES__*``)."""


SqlName = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,62}$")]


class GroupCommitConfig(BaseModel):
    """How the relay groups consecutive source transactions into one Kafka transaction.

    A group closes at whichever limit comes first, or when the slot has nothing more to
    send. A source transaction is never split: one larger than the limits goes alone."""

    model_config = _MODEL

    linger_ms: Annotated[int, Field(ge=0, le=60_000)] = 100
    """Longest a group stays open after its first source transaction (Kafka Streams commits every 100 ms)."""
    max_events: Annotated[int, Field(ge=1)] = 10_000
    max_bytes: Annotated[ByteSize, Field(gt=0)] = ByteSize(16 * 1024 * 1024)
    max_transactions: Annotated[int, Field(ge=1, le=10_000)] = 1_000
    """Source transactions per group; bounds the size of its manifest record."""


class RelayConfig(BaseModel):
    """The outbox relay: which table, which slot, where events go."""

    model_config = _MODEL

    id: PipelineName = "outbox"
    """Relay id: names the Kafka ``transactional.id`` (``tidemark-relay-<id>``), so two relays with one id fence each other."""
    table: Annotated[str, Field(pattern=r"^([a-z_][a-z0-9_]*\.)?[a-z_][a-z0-9_]*$")] = "public.outbox"
    slot: SqlName | None = None
    """Logical replication slot; default ``tidemark_<id>`` (with ``-`` as ``_``)."""
    publication: SqlName | None = None
    """Publication of the table's inserts; default ``tidemark_<id>``."""
    topic: str = "outbox.event.{aggregatetype}"
    """Topic of an event; ``{aggregatetype}`` is replaced by the event's aggregate type."""
    routes: dict[str, str] = {}
    """Aggregate type -> topic, overriding ``topic`` for those types."""
    offsets_topic: str = "tidemark.relay-offsets"
    """Compacted topic holding each relay's position, written in the same Kafka transaction as the events."""
    manifest_topic: str = "tidemark.relay-manifest"
    """One record per Kafka transaction, written in it: each source transaction's exact event spans (G3)."""
    topic_partitions: Annotated[int, Field(ge=1)] | None = None
    """Partitions of event topics the relay creates; unset: the cluster's ``num.partitions``."""
    replication_factor: Annotated[int, Field(ge=1)] | None = None
    """Of every topic the relay creates; unset: the cluster's ``default.replication.factor``."""
    min_insync_replicas: Annotated[int, Field(ge=1)] | None = None
    """``min.insync.replicas`` of the topics the relay creates; unset: the cluster's default."""
    max_transaction_events: Annotated[int, Field(ge=1)] = 100_000
    """Largest source transaction relayed (as one Kafka transaction, held in memory); larger ones stop the relay."""
    max_transaction_bytes: Annotated[ByteSize, Field(gt=0)] = ByteSize(256 * 1024 * 1024)
    """The same limit in bytes of its events (ids, types, keys, payloads)."""
    group: GroupCommitConfig = GroupCommitConfig()
    kafka_security: KafkaSecurity | None = None
    """The relay's own Kafka credentials (its principal), instead of ``kafka.security``."""
    on_oversized: Literal["stop", "dead_letter"] = "stop"
    """An event larger than Kafka takes (the producer's and the topic's message size limits):
    ``stop`` the relay before anything of its source transaction is produced, naming it, until
    an operator runs ``tidemark relay dead-letter --xid N``; or ``dead_letter`` the whole source
    transaction (every event, into ``<table>_dead_letters``) and go on. Never half of it."""
    format: Literal["json", "avro", "protobuf"] = "json"
    """``json``: each event's value is its ``jsonb`` payload as text. ``avro``, ``protobuf``: the
    payload serialized with the newest version of its topic's subject (``<topic>-value``) in
    ``schema_registry``, in Confluent's framing (Protobuf: the version's first message, its JSON
    mapping); schemas are registered ahead (a JSON payload names no schema to register)."""
    on_invalid_payload: Literal["stop", "dead_letter"] = "stop"
    """``avro``, ``protobuf``: an event whose payload does not match its subject's schema (or a ``bytea`` payload
    not in Confluent's framing): ``stop`` the relay before anything of its source transaction is
    produced, naming it (as ``on_oversized``), or ``dead_letter`` the whole source transaction and go on."""
    schemas: dict[str, Path] = {}
    """``avro``: topic -> Avro schema file (``.avsc``) its payloads are serialized with, instead of
    the subject's newest version; that schema must be registered under ``<topic>-value`` (or
    ``auto_register``)."""
    auto_register: bool = False
    """``avro``: register each ``schemas`` file under its subject when it is not there yet (the
    registry's compatibility rule decides whether it may be). Off: schemas are registered ahead,
    by whoever owns them, and a schema the registry lacks stops the relay."""
    schema_refresh_seconds: Annotated[float, Field(gt=0)] = 60.0
    """``avro``, ``protobuf``: how often the relay asks the registry for a newer version of each
    subject it serializes with, and takes it (a version the registry accepted, so consumers read
    it). A payload with a field its schema lacks makes it ask at once (at most once per subject
    every few seconds). A ``relay.schemas`` file is the topic's schema until the relay restarts."""
    payload_column: Literal["jsonb", "bytea"] = "jsonb"
    """The payload column's type ``tidemark outbox init`` gives a new outbox table. ``bytea``: the
    application serializes values itself and the relay sends them unchanged whatever ``format``
    (in ``avro``, only checked to be in Confluent's framing). The relay follows the table's
    actual type, so an existing table keeps its own."""
    ack_every: Annotated[int, Field(ge=1)] = 50
    """Relayed transactions between housekeeping deletes and slot confirmations."""
    transaction_timeout_ms: Annotated[int, Field(ge=1000, le=900_000)] = 60_000
    kafka_retry_seconds: Annotated[float, Field(gt=0)] = 60.0
    """How long one Kafka call is retried before the relay steps back, reconnects and tries again.
    An outage never stops the relay: it waits (backing off up to 30 s) and resumes by itself."""

    @model_validator(mode="after")
    def _distinct_topics(self) -> RelayConfig:
        if self.offsets_topic == self.manifest_topic:
            raise ValueError("offsets_topic and manifest_topic must differ (one is compacted, the other is not)")
        if (self.schemas or self.auto_register) and self.format != "avro":
            raise ValueError("relay.schemas and relay.auto_register apply to format: avro")
        if self.auto_register and not self.schemas:
            raise ValueError("relay.auto_register registers the files of relay.schemas: give them (topic -> .avsc)")
        return self

    @property
    def slot_name(self) -> str:
        return self.slot or f"tidemark_{self.id.replace('-', '_')}"

    @property
    def publication_name(self) -> str:
        return self.publication or f"tidemark_{self.id.replace('-', '_')}"

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dead_letters"

    @property
    def transactional_id(self) -> str:
        return f"tidemark-relay-{self.id}"

    def topic_for(self, aggregatetype: str) -> str:
        return self.routes.get(aggregatetype) or self.topic.replace("{aggregatetype}", aggregatetype)


class TidemarkConfig(BaseModel):
    model_config = _MODEL

    kafka: KafkaConnection = KafkaConnection()
    schema_registry: SchemaRegistryConfig = SchemaRegistryConfig()
    postgres: PostgresConnection = PostgresConnection()
    relay: RelayConfig = RelayConfig()
    pipelines: tuple[PipelineConfig, ...] = ()

    @field_validator("pipelines")
    @classmethod
    def _unique(cls, pipelines: tuple[PipelineConfig, ...]) -> tuple[PipelineConfig, ...]:
        names = [p.name for p in pipelines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pipeline names must be unique; repeated: {', '.join(dupes)}")
        return pipelines

    def with_security(self, security: KafkaSecurity | None) -> TidemarkConfig:
        """This config with ``security`` (a component's own credentials) as ``kafka.security``."""
        if security is None:
            return self
        return self.model_copy(update={"kafka": self.kafka.model_copy(update={"security": security})})

    def for_pipeline(self, name: str) -> TidemarkConfig:
        """The config as pipeline ``name``'s clients use it: with its own credentials if it has any."""
        return self.with_security(self.pipeline(name).kafka_security)

    def for_relay(self) -> TidemarkConfig:
        return self.with_security(self.relay.kafka_security)

    def pipeline(self, name: str) -> PipelineConfig:
        for p in self.pipelines:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.pipelines) or "(none)"
        raise ConfigError(f"no pipeline named {name!r} in the config; known pipelines: {known}")


# What to write instead, for fields whose raw pydantic message does not say it.
_HINTS = {
    "start": "expected 'earliest', 'latest' or {timestamp: 2026-01-31T00:00:00Z}",
    "name": "use lower-case letters, digits, '-' or '_', starting with a letter (at most 63)",
    "event_id": "expected header:<name>, key, or field:<json field>",
}


def _where(loc: tuple[Any, ...]) -> tuple[str, str | None]:
    """Dotted path of a validation error, without pydantic's union-branch tags."""
    out, last = "", None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[a-z_][a-z0-9_]*", str(part)):  # a field; tags look like `literal[...]`, `TimestampStart`
            out += f".{part}" if out else str(part)
            last = str(part)
    return out or "(top level)", last


def parse_config(data: Any, source: str = "tidemark.yaml") -> TidemarkConfig:
    try:
        return TidemarkConfig.model_validate(data or {})
    except ValidationError as exc:
        lines: list[str] = []
        for err in exc.errors():
            where, field = _where(err["loc"])
            msg = _HINTS.get(field or "", err["msg"].removeprefix("Value error, "))
            line = f"  {where}: {msg}"
            if line not in lines:
                lines.append(line)
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(lines)) from None


def load_config(path: Path) -> TidemarkConfig:
    if not path.exists():
        raise ConfigError(f"config file {path} not found: pass --config PATH or create tidemark.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_config(data, str(path))
