"""The Prefect API check before ``tidemark serve``: a busy server is waited for, a missing one is not."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from infra.prefect_server import check_api
from tidemark.errors import ServiceUnavailableError


@contextmanager
def _server(slow_requests: int, delay: float) -> Iterator[str]:
    """A local HTTP server whose first ``slow_requests`` health checks take ``delay`` seconds."""
    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if len(seen) <= slow_requests:
                time.sleep(delay)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_api_is_asked_again_and_a_missing_one_fails_at_once() -> None:
    with _server(slow_requests=2, delay=1.5) as url:
        check_api(url, timeout=0.5, patience=10)  # two timed-out checks, then an answer
    with _server(slow_requests=100, delay=3) as stuck, pytest.raises(ServiceUnavailableError, match="timed out"):
        check_api(stuck, timeout=0.3, patience=1)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError, match="refused"):
        check_api(url, timeout=0.3, patience=30)  # the server is gone: no waiting
    assert time.monotonic() - started < 5
