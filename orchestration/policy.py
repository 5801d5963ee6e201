"""What orchestration retries, and how the relay supervisor restarts: pure decisions.

Retries follow the exception markers of :mod:`tidemark.errors` and nothing else: a
:class:`~tidemark.errors.TransientError` ("may succeed later") is retried, a
:class:`~tidemark.errors.TerminalError` ("a person has to act") never is, and an
unmarked exception is a bug, which a retry would only repeat.

The relay runs as a child process, so the supervisor decides on its exit status, which
the CLI derives from the same markers: 0 is a clean stop (SIGTERM), 75 transient, 78
bad config, 1 and 3 terminal (fatal producer error, fenced by a newer relay), a signal
a crash. Crashes and transient exits restart with exponential backoff; a relay that
then runs healthily for ``healthy_after`` seconds starts the backoff over.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tidemark.errors import TransientError


def is_transient(exc: BaseException | None) -> bool:
    return isinstance(exc, TransientError)


def retry_only_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: the failed state's exception must be transient."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        try:
            state.result(raise_on_failure=True)
        except BaseException as raised:  # noqa: BLE001 - we only classify it
            exc = raised
    return is_transient(exc)


class ExitKind(Enum):
    STOPPED = "stopped"
    """Exited 0: asked to stop (SIGTERM) or ran out of work; do not restart."""
    TERMINAL = "terminal"
    """Retrying cannot help (fenced, fatal, bad config); do not restart."""
    RESTART = "restart"
    """A crash, a kill or a transient failure: restart after a backoff."""


TERMINAL_EXIT_CODES = frozenset({1, 3, 78})


def classify_exit(code: int) -> ExitKind:
    if code == 0:
        return ExitKind.STOPPED
    if code in TERMINAL_EXIT_CODES:
        return ExitKind.TERMINAL
    return ExitKind.RESTART  # 75 (transient), 70 (internal error), 137/-9 and other signals


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


@dataclass
class Backoff:
    """Delays between restarts: ``first`` doubling up to ``cap``; reset by a healthy run."""

    first: float = 1.0
    cap: float = 60.0
    healthy_after: float = 120.0
    failures: int = 0

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.healthy_after:
            self.failures = 0
        delay = min(self.cap, self.first * (2 ** self.failures))
        self.failures += 1
        return delay
