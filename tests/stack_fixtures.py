"""Where the tests' servers come from, in order of preference.

1. ``TIDEMARK_KAFKA__BOOTSTRAP_SERVERS`` / ``TIDEMARK_POSTGRES__DSN``: an existing cluster
   or database the user points us at; nothing is started.
2. A Docker engine that answers (a developer laptop): testcontainers.
   ``TIDEMARK_TEST_BACKEND=embedded`` skips this step.
3. Otherwise the embedded stack: the same code ``tidemark stack up`` runs, with state in
   a temporary directory and free ports, so a developer's own stack is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra import jars as jar_cache
from infra.kafka import EmbeddedKafka
from infra.postgres import EmbeddedPostgres
from infra.process import free_port_block as _free_port_block

#: Moves where the test servers look for free ports: CI runs its slow and S3 stages at the
#: same time, and two sessions probing the same block before either binds would collide.
PORT_OFFSET = int(os.environ.get("TIDEMARK_TEST_PORT_OFFSET", "0"))


def free_port_block(size: int, start: int = 29092) -> int:
    """:func:`infra.process.free_port_block`, from ``start`` moved by :data:`PORT_OFFSET`."""
    return _free_port_block(size, start=start + PORT_OFFSET)
from infra.tls import write_private
from tidemark.settings import Settings


def docker_engine_answers() -> bool:
    if os.environ.get("TIDEMARK_TEST_BACKEND", "auto") == "embedded":
        return False
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:  # noqa: BLE001  (no engine, no socket, no permission: all mean "not available")
        return False


@contextmanager
def kafka_cluster(settings: Settings, state: Path, *, brokers: int = 1) -> Iterator[tuple[str, EmbeddedKafka | None]]:
    """Yield ``(bootstrap servers, embedded cluster or None)``."""
    if settings.kafka.bootstrap_servers:
        yield settings.kafka.bootstrap_servers, None
        return
    if brokers == 1 and docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
            yield container.get_bootstrap_server(), None
        return
    jars = jar_cache.resolve(settings.home_dir, "kafka")
    cluster = EmbeddedKafka(state, jars, port=free_port_block(2 * brokers), brokers=brokers, heap="512m")
    cluster.start()
    try:
        yield cluster.bootstrap_servers, cluster
    finally:
        _stop(cluster)


def _stop(cluster: EmbeddedKafka) -> None:
    """Stop ``cluster``, closing first the manifest consumers runs kept for later ones (else they
    retry the stopped brokers, and log each retry, until they expire)."""
    from pipelines.transactions.consumers import ManifestConsumers

    ManifestConsumers.close_idle()
    cluster.stop()


@contextmanager
def postgres_server(settings: Settings, state: Path) -> Iterator[tuple[str, EmbeddedPostgres | None]]:
    """Yield ``(libpq DSN, embedded server or None)``."""
    if settings.postgres.dsn is not None:
        yield settings.postgres.dsn.get_secret_value(), None
        return
    if docker_engine_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:17-alpine").with_command("postgres -c wal_level=logical")
        with container:
            dsn = (f"host={container.get_container_host_ip()} port={container.get_exposed_port(5432)} "
                   f"user={container.username} password={container.password} dbname={container.dbname}")
            yield dsn, None
        return
    server = EmbeddedPostgres(state, port=free_port_block(1, start=25432))
    server.start()
    try:
        yield server.dsn, server
    finally:
        server.stop()


#: Starts every password :func:`secured_kafka` gives a principal: recognisable wherever it might leak.
CANARY = "TidemarkCanary"


@contextmanager
def secured_kafka(settings: Settings, root: Path, security: str, *, brokers: int = 1) -> Iterator[EmbeddedKafka]:
    """An embedded cluster secured as ``TIDEMARK_KAFKA__SECURITY`` would make it (``sasl_ssl`` or
    ``mtls``), on free ports, with the ``relay`` and ``ingest`` passwords starting :data:`CANARY`."""
    jars = jar_cache.resolve(settings.home_dir, "kafka")
    cluster = EmbeddedKafka(root, jars, port=free_port_block(2 * brokers, start=27092), brokers=brokers, heap="384m",
                            security=security)
    for principal in ("relay", "ingest"):  # before the format creates the users with them
        write_private(root / "secrets" / f"{principal}.password", f"{CANARY}-{principal}-{os.urandom(6).hex()}".encode())
    cluster.start()
    try:
        yield cluster
    finally:
        _stop(cluster)
