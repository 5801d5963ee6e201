"""Session-scoped servers (Kafka, PostgreSQL, Spark) and factories shared by all tests."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.stack_fixtures import kafka_cluster, postgres_server
from tidemark.settings import Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load_settings()


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with kafka_cluster(settings, tmp_path_factory.mktemp("kafka")) as (bootstrap, _):
        yield bootstrap


@pytest.fixture(scope="session")
def postgres_dsn(settings: Settings) -> Iterator[str]:
    # Not under pytest's temp root: the server runs as another user, and every pytest session
    # that starts meanwhile makes /tmp/pytest-of-<user> private again, cutting it off.
    state = Path(tempfile.mkdtemp(prefix="tidemark-test-postgres-"))
    try:
        with postgres_server(settings, state) as (dsn, _):
            yield dsn
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(settings: Settings, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from infra.spark import build_session

    session = build_session(settings, "tidemark-tests", warehouse=tmp_path_factory.mktemp("warehouse"))
    yield session
    session.stop()


_topic_counter = itertools.count()


@pytest.fixture(scope="session")
def topic_factory(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Create a fresh topic; returns its name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    # Dropped at teardown, before the broker stops: a librdkafka admin client is a producer
    # handle, and one outliving the broker printed "rdkafka#producer-N ... Connection refused".
    clients = {"admin": AdminClient({"bootstrap.servers": kafka_bootstrap})}
    run = uuid.uuid4().hex[:6]

    def create(prefix: str = "t", partitions: int = 1, replication: int = 1) -> str:
        name = f"{prefix}-{run}-{next(_topic_counter)}"
        futures = clients["admin"].create_topics([NewTopic(name, partitions, replication)], operation_timeout=30)
        futures[name].result(30)
        return name

    yield create
    clients.clear()


@pytest.fixture(autouse=True)
def _release_replication_slots() -> Iterator[None]:
    """Each test's outbox slots go when it ends: a session creates more than the server allows."""
    yield
    from tests.relay_harness import release_slots

    release_slots()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prefect server (API and its services: schedules, lease reaping), shared by the session."""
    from infra.prefect_server import EmbeddedPrefect
    from infra.process import free_port

    server = EmbeddedPrefect(tmp_path_factory.mktemp("prefect"), port=free_port())
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def delta_path(tmp_path: Path) -> str:
    return str(tmp_path / "table")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
