"""Graceful stop for long-running commands (``ingest --follow``, ``relay run``)."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM/SIGINT: the command finishes the batch or transaction in flight, then stops."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.warning("signal %d: finishing the batch in flight, then stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
