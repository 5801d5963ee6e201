"""Session-scoped servers (Kafka, PostgreSQL, Spark) and factories shared by all tests.

``TIDEMARK_TEST_STORAGE=s3`` (CI's S3 stage, ``make test-s3``) runs the session against an
embedded S3 server: every Spark session and ``tidemark`` process of the tests gets
``TIDEMARK_STORAGE=s3`` and the server's endpoint, and :func:`table_root` puts tables in its
bucket, so the same tests prove the same guarantees on ``s3a://`` tables.
"""

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


@pytest.fixture(scope="session")
def schema_registry(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real schema registry (the embedded Apicurio Registry), shared by the session: its URL.
    Pipelines reach it through ``TIDEMARK_REGISTRY__PORT``, as the embedded stack's do."""
    from infra.registry import EmbeddedRegistry
    from tests.stack_fixtures import free_port_block

    port = free_port_block(2, start=28100)
    registry = EmbeddedRegistry(tmp_path_factory.mktemp("registry"), settings.home_dir, port=port,
                                java=settings.registry.java)
    before = os.environ.get("TIDEMARK_REGISTRY__PORT")
    os.environ["TIDEMARK_REGISTRY__PORT"] = str(port)
    try:
        yield registry.start()
    finally:
        registry.stop()
        if before is None:
            os.environ.pop("TIDEMARK_REGISTRY__PORT", None)
        else:
            os.environ["TIDEMARK_REGISTRY__PORT"] = before


@pytest.fixture
def delta_path(tmp_path: Path) -> str:
    return str(tmp_path / "table")


def s3_mode() -> bool:
    return os.environ.get("TIDEMARK_TEST_STORAGE") == "s3"


#: The S3 stage's server, started before any test's settings are read (pytest_configure).
_S3: dict[str, object] = {}
S3_BUCKET = "tidemark-test"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if s3_mode() and "TIDEMARK_S3__ENDPOINT" not in os.environ:
        from infra.process import free_port
        from infra.s3 import EmbeddedS3

        root = Path(tempfile.mkdtemp(prefix="tidemark-test-s3-"))
        server = EmbeddedS3(root, load_settings().home_dir, port=free_port(), bucket=S3_BUCKET)
        server.start()
        _S3.update(server=server, root=root)
        os.environ.update({"TIDEMARK_STORAGE": "s3", "TIDEMARK_S3__ENDPOINT": server.endpoint,
                           "TIDEMARK_S3__CREDENTIALS_FILE": str(server.credentials),
                           "TIDEMARK_S3__BUCKET": S3_BUCKET})


def pytest_unconfigure(config: pytest.Config) -> None:
    server = _S3.pop("server", None)
    if server is not None:
        server.stop()  # type: ignore[attr-defined]
        if os.environ.get("TIDEMARK_TEST_KEEP_S3"):  # to read a failed test's objects afterwards
            print(f"\nthe S3 stage's objects are kept in {server.data}")  # type: ignore[attr-defined]
        else:
            shutil.rmtree(_S3.pop("root"), ignore_errors=True)  # type: ignore[arg-type]


def s3_server():  # type: ignore[no-untyped-def]
    """The S3 stage's embedded server (None outside it)."""
    return _S3.get("server")


def on_disk(path: str) -> Path:
    """Where the file or table at ``path`` lies on this machine: itself, or for an ``s3a://`` path
    the S3 server's backing directory. For tests that poll a table's log; what they assert
    about a table's content they read through Spark or delta-rs."""
    if "://" not in path:
        return Path(path)
    server = s3_server()
    assert server is not None and path.startswith("s3a://"), path
    return server.data / path.split("://", 1)[1]  # type: ignore[attr-defined]


@pytest.fixture
def table_root(tmp_path: Path) -> str:
    """Where a test's tables go: its temporary directory, or a fresh prefix of the S3 stage's bucket."""
    if s3_mode():
        return f"s3a://{S3_BUCKET}/{uuid.uuid4().hex[:12]}"
    return str(tmp_path)


@pytest.fixture
def needs_s3() -> None:
    if not s3_mode():
        pytest.skip("an S3 test: runs in CI's S3 stage (TIDEMARK_TEST_STORAGE=s3, `make test-s3`)")
