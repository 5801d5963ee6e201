"""Pure decisions of orchestration: what is retried, how the relay is restarted."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from orchestration.policy import Backoff, ExitKind, classify_exit, describe_exit, retry_only_transient
from tidemark.errors import ConfigError, ServiceUnavailableError, TerminalError, TransientError


def _failed(exc: BaseException) -> SimpleNamespace:
    def result(raise_on_failure: bool = True) -> None:
        raise exc

    return SimpleNamespace(data=exc, result=result)


@pytest.mark.parametrize(("exc", "retried"), [
    (ServiceUnavailableError("broker restarting"), True),
    (TransientError("lock held"), True),
    (TerminalError("fenced"), False),
    (ConfigError("bad field"), False),
    (ValueError("a bug"), False),
])
def test_only_transient_errors_are_retried(exc: BaseException, retried: bool) -> None:
    assert retry_only_transient(None, None, _failed(exc)) is retried


def test_the_exception_is_found_when_the_state_holds_a_result_record() -> None:
    exc = ServiceUnavailableError("x")
    state = _failed(exc)
    state.data = object()  # Prefect may keep a persisted-result record instead of the exception
    assert retry_only_transient(None, None, state) is True


@pytest.mark.parametrize(("code", "kind"), [
    (0, ExitKind.STOPPED), (1, ExitKind.TERMINAL), (3, ExitKind.TERMINAL), (78, ExitKind.TERMINAL),
    (75, ExitKind.RESTART), (70, ExitKind.RESTART), (-signal.SIGKILL, ExitKind.RESTART), (137, ExitKind.RESTART),
])
def test_relay_exit_codes(code: int, kind: ExitKind) -> None:
    assert classify_exit(code) is kind


def test_describe_exit_names_the_signal() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exit 3"


def test_backoff_doubles_to_the_cap_and_resets_after_a_healthy_run() -> None:
    b = Backoff(first=1, cap=10, healthy_after=60)
    assert [b.next_delay(ran_for=2) for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert b.next_delay(ran_for=61) == 1
    assert b.next_delay(ran_for=5) == 2


class _HoldsALock(TransientError):
    """Like a Py4J error: holds something that does not pickle."""

    def __init__(self, message: str) -> None:
        import threading

        super().__init__(message)
        self.lock = threading.Lock()


@pytest.mark.parametrize(("exc", "kind", "retried"), [
    (ServiceUnavailableError("broker restarting"), ServiceUnavailableError, True),  # pickles: itself
    (ConfigError("bad field"), ConfigError, False),
    (_HoldsALock("kafka timed out\nat line 1\nat line 2\nat line 3"), TransientError, True),
])
def test_a_warm_driver_error_reaches_the_flow_run_with_its_marker(exc: BaseException, kind: type,
                                                                  retried: bool) -> None:
    import pickle

    from orchestration.driver import _portable

    crossed = pickle.loads(pickle.dumps(_portable(exc)))
    assert isinstance(crossed, kind)
    assert retry_only_transient(None, None, _failed(crossed)) is retried
    assert "kafka timed out" in str(crossed) or str(crossed) == str(exc)
    assert "line 3" not in str(crossed), "only the first lines cross; the serve log has the rest"


def test_an_unpicklable_unmarked_error_stays_unmarked() -> None:
    import pickle
    import threading

    from orchestration.driver import RemoteJobError, _portable

    class Py4JLike(Exception):
        def __init__(self) -> None:
            super().__init__("An error occurred while calling o42.save")
            self.java = threading.Lock()

    crossed = pickle.loads(pickle.dumps(_portable(Py4JLike())))
    assert isinstance(crossed, RemoteJobError) and "Py4JLike: An error occurred while calling o42.save" in str(crossed)
    assert retry_only_transient(None, None, _failed(crossed)) is False
