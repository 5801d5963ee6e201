"""The warm driver's socket (orchestration.driver): who may submit, and what a refused request says.

No Spark here: the session factory fails on purpose, so every request that gets in meets
that failure. That the driver keeps runs exactly-once is tested with real Spark, Kafka and
Prefect in tests/integration/test_warm_driver.py.
"""

from __future__ import annotations

import stat
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from orchestration import driver
from tidemark.errors import TerminalError


def _no_session() -> None:
    raise RuntimeError("no JVM in this test")


def test_only_the_key_holder_gets_in_and_a_refusal_does_not_stop_the_service() -> None:
    with driver.DriverService(_no_session) as service:  # type: ignore[arg-type]
        assert stat.S_IMODE(service.directory.stat().st_mode) == 0o700
        with pytest.raises((AuthenticationError, EOFError, ConnectionError)):
            Client(str(service.directory / "socket"), family="AF_UNIX", authkey=b"not the key" * 3)
        # The key holder (this process: start() named the directory in the environment) still gets answers.
        with pytest.raises(TerminalError, match="Spark session did not start.*RuntimeError"):
            driver.run("ingest", config="tidemark.yaml", pipeline="orders")
        with pytest.raises(TerminalError, match="knows no job 'explode'"):
            driver.run("explode", pipeline="orders")
    assert not service.directory.exists(), "the socket and its key are removed with the service"
    assert driver.run("ingest", config="tidemark.yaml", pipeline="orders") is None, "no driver: run it here"


def test_a_vanished_driver_is_a_transient_error_naming_serve(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "key").write_bytes(b"k" * 32)
    monkeypatch.setenv(driver.ENV, str(tmp_path))
    with pytest.raises(driver.DriverUnavailableError, match="restart `tidemark serve`"):
        driver.run("ingest", config="tidemark.yaml", pipeline="orders")
