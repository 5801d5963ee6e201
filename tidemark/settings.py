"""Typed, frozen settings for the stack Tidemark runs against.

Values come from environment variables named ``TIDEMARK_<SECTION>__<KEY>`` (for example
``TIDEMARK_KAFKA__BOOTSTRAP_SERVERS``), then the defaults below. Leaving
``kafka.bootstrap_servers`` or ``postgres.dsn`` unset means "use the embedded server
that ``tidemark stack up`` runs"; setting them points everything at an existing cluster
or database instead. Secrets are :class:`~pydantic.SecretStr` so they never reach logs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidemark.errors import ConfigError

Port = Annotated[int, Field(ge=1024, le=65535)]

_SECTION = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class KafkaSettings(BaseModel):
    model_config = _SECTION

    bootstrap_servers: str | None = None
    """Existing cluster to use (``host:port,...``); unset runs the embedded KRaft broker."""
    port: Port = 19092
    """First client port of the embedded broker(s); broker *i* listens on ``port + 2*i``."""
    brokers: Annotated[int, Field(ge=1, le=3)] = 1
    """Embedded brokers: 1 (RF 1) or 3 (RF 3, ``min.insync.replicas=2``)."""
    heap: str = "512m"
    """JVM heap of each embedded broker."""
    security: Literal["plaintext", "sasl_ssl", "mtls"] = "plaintext"
    """How the embedded cluster's clients authenticate: ``sasl_ssl`` (SCRAM over TLS) or
    ``mtls`` (client certificates), both with ACLs (docs/security.md, "The secured embedded cluster").
    Each keeps its own state (``stack/kafka-<security>``), so switching formats a new cluster."""


class PostgresSettings(BaseModel):
    model_config = _SECTION

    dsn: SecretStr | None = None
    """libpq DSN of an existing server (needs ``wal_level=logical``); unset runs the embedded one."""
    port: Port = 15432
    """TCP port of the embedded server on 127.0.0.1."""
    security: Literal["plaintext", "tls"] = "plaintext"
    """``tls``: the embedded server takes TCP clients over TLS with a scram-sha-256 password
    only, and its DSN verifies the certificate (``sslmode=verify-full``). Own state
    (``stack/postgres-tls``), so switching initialises a new server."""


class PrefectSettings(BaseModel):
    model_config = _SECTION

    port: Port = 14200
    """Port of the embedded Prefect server (API and UI) on 127.0.0.1; unused when
    ``PREFECT_API_URL`` names a server."""


class SparkSettings(BaseModel):
    model_config = _SECTION

    master: str = "local[*]"
    """Spark master URL; ``local[*]`` by default, ``spark://...`` for a standalone cluster."""
    driver_memory: str = "2g"
    """Driver heap (local mode runs executors inside the driver)."""
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    """``spark.sql.shuffle.partitions``: Spark's 200 wastes time on 2 cores."""
    class_data_sharing: bool = True
    """Start the driver JVM from the class archive ``make bootstrap`` trains (infra.cds), when there is one."""


class S3Settings(BaseModel):
    """How Spark and delta-rs reach an S3-compatible object store (``TIDEMARK_S3__*``).

    Credentials never go in ``tidemark.yaml``: give them here (the secret from the
    environment), in an AWS shared-credentials file, or leave both unset for the AWS default
    chain (environment, profile, instance role). The embedded server's own credentials are
    a file it writes under the stack's home.
    """

    model_config = _SECTION

    endpoint: str | None = None
    """URL of the S3 endpoint (``https://s3.eu-west-1.amazonaws.com``, ``http://minio:9000``); unset
    with ``TIDEMARK_STORAGE=s3`` runs the embedded server (s3proxy) on 127.0.0.1."""
    port: Port = 19000
    """Port of the embedded S3 server on 127.0.0.1."""
    bucket: str = "tidemark"
    """The bucket the embedded server creates and the demo's tables live in."""
    region: str = "us-east-1"
    """Signing region."""
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    credentials_file: Path | None = None
    """An AWS shared-credentials file (``[default]`` with ``aws_access_key_id`` and
    ``aws_secret_access_key``), read when a client is configured."""
    path_style: bool = True
    """Address buckets as ``endpoint/bucket`` (every S3-compatible server), not ``bucket.endpoint``."""


class RegistrySettings(BaseModel):
    """The embedded schema registry (``TIDEMARK_REGISTRY__*``), for ``format: avro`` pipelines whose
    ``schema_registry.url`` is unset."""

    model_config = _SECTION

    enabled: bool = False
    """``tidemark stack up`` runs the embedded registry (Apicurio Registry; about 10 s to start)."""
    port: Port = 18081
    """Port of the embedded registry's API on 127.0.0.1 (its management interface takes the next)."""
    java: Path | None = None
    """The ``bin/java`` of a Java 21 or later to run it with (default: the first found)."""


class Settings(BaseSettings):
    """Everything Tidemark reads from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="TIDEMARK_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    home: Path = Path("~/.tidemark")
    """State and caches: resolved jars, embedded server data, logs."""
    kafka: KafkaSettings = KafkaSettings()
    postgres: PostgresSettings = PostgresSettings()
    spark: SparkSettings = SparkSettings()
    prefect: PrefectSettings = PrefectSettings()
    storage: Literal["local", "s3"] = "local"
    """Where tables may live: ``local`` paths (and HDFS, ABFS, GCS through Delta's own stores) or
    also ``s3a://`` ones, which loads S3A and Tidemark's conditional-write log store into Spark
    (docs/object-storage.md). With ``s3`` and no ``s3.endpoint``, ``tidemark stack up``
    runs an embedded S3 server."""
    s3: S3Settings = S3Settings()
    registry: RegistrySettings = RegistrySettings()

    @property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()


def load_settings() -> Settings:
    """Read settings from the environment, turning validation errors into a ConfigError."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = "__".join(str(p) for p in err["loc"]).upper()
            lines.append(f"  TIDEMARK_{field}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(
            "invalid Tidemark settings in the environment:\n"
            + "\n".join(lines)
            + "\nfix or unset these variables; `tidemark stack status` shows what is in effect"
        ) from None


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
