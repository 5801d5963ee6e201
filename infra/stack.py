"""The local stack as one unit: what ``tidemark stack up | down | status`` drive.

Each service is embedded unless its setting points at an existing server: with
``TIDEMARK_KAFKA__BOOTSTRAP_SERVERS`` set no broker is started, with
``TIDEMARK_POSTGRES__DSN`` set no PostgreSQL is started, and an S3 server runs only with
``TIDEMARK_STORAGE=s3`` and no ``TIDEMARK_S3__ENDPOINT``, and a schema registry only with
``TIDEMARK_REGISTRY__ENABLED=true`` (for ``format: avro`` pipelines). Spark is always a library
inside the calling process (``local[*]``) or a cluster named by ``TIDEMARK_SPARK__MASTER``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra import jars as jar_cache
from infra.kafka import EmbeddedKafka
from infra.postgres import EmbeddedPostgres
from infra.prefect_server import EmbeddedPrefect
from infra.registry import EmbeddedRegistry
from infra.s3 import EmbeddedS3
from tidemark.config import KafkaConnection, KafkaSecurity
from tidemark.settings import Settings


@dataclass(frozen=True)
class Endpoints:
    """Where the running stack answers, and how a client authenticates to its Kafka."""

    kafka_bootstrap: str
    postgres_dsn: str
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """The embedded cluster's ``admin`` (files, no secret in clear); plaintext for an external cluster."""

    def kafka_client(self) -> dict[str, Any]:
        """librdkafka properties for this stack's Kafka."""
        from connectors.kafka_config import librdkafka_config

        return librdkafka_config(KafkaConnection(security=self.kafka_security), self.kafka_bootstrap)

    def kafka_spark_options(self) -> dict[str, str]:
        from connectors.kafka_config import spark_options

        return spark_options(KafkaConnection(security=self.kafka_security), self.kafka_bootstrap)


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root: Path = settings.home_dir / "stack"

    # -- the embedded pieces (None when an external server is configured) ------------

    def kafka(self) -> EmbeddedKafka | None:
        if self.settings.kafka.bootstrap_servers:
            return None
        jars = jar_cache.resolve(self.settings.home_dir, "kafka")
        k = self.settings.kafka
        root = self.root / ("kafka" if k.security == "plaintext" else f"kafka-{k.security}")
        return EmbeddedKafka(root, jars, port=k.port, brokers=k.brokers, heap=k.heap, security=k.security)

    def postgres(self) -> EmbeddedPostgres | None:
        if self.settings.postgres.dsn is not None:
            return None
        pg = self.settings.postgres
        tls = pg.security == "tls"
        return EmbeddedPostgres(self.root / ("postgres-tls" if tls else "postgres"), port=pg.port, tls=tls)

    def s3(self) -> EmbeddedS3 | None:
        """The embedded S3 server, with ``TIDEMARK_STORAGE=s3`` and no endpoint of the user's."""
        if self.settings.storage != "s3" or self.settings.s3.endpoint is not None:
            return None
        from tidemark.storage import EMBEDDED_CREDENTIALS

        c = self.settings.s3
        return EmbeddedS3(self.root / "s3", self.settings.home_dir, port=c.port, bucket=c.bucket,
                          credentials=self.settings.home_dir / EMBEDDED_CREDENTIALS)

    def registry(self) -> EmbeddedRegistry | None:
        """The embedded schema registry, with ``TIDEMARK_REGISTRY__ENABLED=true``; secured (HTTPS and
        basic authentication) when the stack's Kafka is (``TIDEMARK_KAFKA__SECURITY``)."""
        c = self.settings.registry
        if not c.enabled:
            return None
        secured = self.settings.kafka.security != "plaintext"
        return EmbeddedRegistry(self.root / ("registry-secured" if secured else "registry"), self.settings.home_dir,
                                port=c.port, java=c.java, secured=secured)

    def prefect(self) -> EmbeddedPrefect | None:
        """The embedded Prefect server, unless ``PREFECT_API_URL`` names one."""
        if os.environ.get("PREFECT_API_URL"):
            return None
        return self._embedded_prefect()

    def _embedded_prefect(self) -> EmbeddedPrefect:
        return EmbeddedPrefect(self.root / "prefect", port=self.settings.prefect.port)

    def prefect_api(self) -> str:
        """The Prefect API to use: ``PREFECT_API_URL``, else the embedded server (started if needed)."""
        server = self.prefect()
        return server.start() if server else os.environ["PREFECT_API_URL"]

    def endpoints(self) -> Endpoints:
        kafka = self.kafka()
        pg = self.postgres()
        bootstrap = kafka.bootstrap_servers if kafka else str(self.settings.kafka.bootstrap_servers)
        dsn = pg.dsn if pg else self.settings.postgres.dsn.get_secret_value()  # type: ignore[union-attr]
        return Endpoints(bootstrap, dsn, kafka.client_security("admin") if kafka else KafkaSecurity())

    # -- lifecycle -----------------------------------------------------------------

    def up(self) -> Endpoints:
        """Start what is embedded and not running yet; idempotent."""
        jar_cache.resolve(self.settings.home_dir, "spark")
        started: list[EmbeddedPostgres | EmbeddedKafka | EmbeddedS3 | EmbeddedRegistry] = []
        try:
            for server in (self.s3(), self.postgres(), self.kafka(), self.registry()):
                if server:
                    server.start()
                    started.append(server)
        except BaseException:
            for server in reversed(started):
                server.stop()
            raise
        return self.endpoints()

    def down(self) -> None:
        """Stop every embedded server this home runs; idempotent."""
        # Whatever PREFECT_API_URL says now: it may name this very server (the demo sets it).
        self._embedded_prefect().stop()
        kafka = self.kafka()
        if kafka:
            kafka.stop()
        pg = self.postgres()
        if pg:
            pg.stop()
        s3 = self.s3()
        if s3:
            s3.stop()
        registry = self.registry()
        if registry:
            registry.stop()

    def status(self) -> list[tuple[str, str, str]]:
        """(component, version, where/state) rows for ``tidemark stack status``."""
        from infra.spark import versions

        rows: list[tuple[str, str, str]] = []
        kafka = self.kafka()
        if kafka:
            for line in kafka.describe():
                rows.append(("Kafka (embedded KRaft)", kafka.version, line))
        else:
            rows.append(("Kafka (external)", "-", str(self.settings.kafka.bootstrap_servers)))
        pg = self.postgres()
        pg_version = _postgres_version(self.endpoints().postgres_dsn)
        if pg:
            rows.append(("PostgreSQL (embedded)", pg_version, pg.describe()))
        else:
            rows.append(("PostgreSQL (external)", pg_version, "TIDEMARK_POSTGRES__DSN"))
        prefect = self.prefect()
        if prefect:
            rows.append(("Prefect server (embedded)", _prefect_version(), prefect.describe()))
        else:
            rows.append(("Prefect server (external)", _prefect_version(), os.environ["PREFECT_API_URL"]))
        s3 = self.s3()
        if s3:
            rows.append(("S3 (embedded s3proxy)", jar_cache.resolve(self.settings.home_dir, "s3proxy")
                         .version_of("s3proxy").removesuffix("-jar-with-dependencies"), s3.describe()))
        elif self.settings.storage == "s3":
            rows.append(("S3 (external)", "-", str(self.settings.s3.endpoint)))
        registry = self.registry()
        if registry:
            rows.append(("Schema registry (embedded Apicurio)", _apicurio_version(self.settings.home_dir),
                         registry.describe()))
        v = versions(self.settings)
        rows.append(("Spark", v["pyspark"], self.settings.spark.master))
        rows.append(("Delta Lake", v["delta-spark (jar)"], f"python package {v['delta-spark (python)']}"))
        rows.append(("spark-sql-kafka", v["spark-sql-kafka (jar)"], "jar cache " + str(self.settings.home_dir / "jars")))
        return rows


def _apicurio_version(home: Path) -> str:
    archives = sorted(jar_cache.resolve(home, "registry").directory.glob("*.tar.gz"))
    return archives[0].name.removeprefix("apicurio-registry-app-").removesuffix("-all.tar.gz") if archives else "-"


def _prefect_version() -> str:
    from importlib.metadata import version

    return version("prefect")


def _postgres_version(dsn: str) -> str:
    import psycopg2

    try:
        conn = psycopg2.connect(dsn, connect_timeout=2)
    except psycopg2.OperationalError:
        return "(not reachable)"
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW server_version")
            row = cur.fetchone()
            return str(row[0]) if row else "?"
    finally:
        conn.close()
