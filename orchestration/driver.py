"""The warm driver: ``tidemark serve`` keeps one SparkSession and runs every served run's Spark work in it.

Why: Prefect's Runner starts each flow run in a new process. A run that started its own
Spark driver paid a JVM, the jars and a session (~15 s, measured on 2 cores) on
every tick of every schedule. Instead the serve process starts the session once, before
the first run, and listens on a Unix socket; the flow-run processes it spawns inherit
:data:`ENV` (the socket's private directory) and their tasks send the job there
(:func:`run`). Prefect keeps everything else: states, retries, slots, artifacts, logs of
the run. A process without :data:`ENV` (``tidemark ingest``, ``make demo``, tests) runs
the job on a session of its own.

A request is one job of :data:`orchestration.jobs.JOBS`: plain data in, a dict out, or
the exception it raised (its transient/terminal marker kept). Isolation between runs:

- Every request runs on a thread of its own, in a Spark job group of its own and in a
  fair-scheduler pool named after its pipeline, so a big batch of one pipeline does
  not queue another pipeline's tasks behind it.
- Requests of one slot (:func:`orchestration.jobs.slot_of`) run one at a time, whatever
  the Prefect slot says: a run that lost its Prefect slot (its lease expired) still
  cannot overlap its successor here.
- A flow run that goes away (killed, cancelled, crashed) closes its socket; the driver
  then cancels its job group until the job's thread has ended, and the next run of
  the pipeline recovers the batch it left as after a SIGKILL (offsets.protocol, step 1).
- A job leaves nothing behind in the session: jobs set no session conf, cache no
  tables and register nothing per pipeline; an exception ends the request, never the
  service. (Tested: ``test_warm_driver``.)

The socket's directory is created 0700 and the connection is authenticated with a
random key kept in it, so only the serve's user's processes can submit work.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from functools import partial
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from orchestration.jobs import JOBS, slot_of
from tidemark.errors import TerminalError, TransientError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from offsets.frames import BatchResult

log = logging.getLogger(__name__)

ENV = "TIDEMARK_DRIVER"
"""The warm driver's directory (``socket`` and ``key`` inside), set by serve for its flow runs."""

FAIR = {"spark.scheduler.mode": "FAIR"}
"""The driver's session schedules jobs fairly between pools (one pool per pipeline)."""

_CANCEL_EVERY = 0.5


class DriverUnavailableError(TransientError):
    """The serve process's warm driver could not be reached, or went away during the run."""


class RemoteJobError(Exception):
    """A driver-side exception that could not cross the socket as itself (an unmarked one is a bug)."""


class RemoteTransientError(TransientError):
    """A transient driver-side exception that could not cross the socket as itself."""


class RemoteTerminalError(TerminalError):
    """A terminal driver-side exception that could not cross the socket as itself."""


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a marked copy of its first lines (Py4J errors hold JVM objects)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure means: send a copy
        text = "\n".join(str(exc).strip().splitlines()[:3])
        kind = (RemoteTransientError if isinstance(exc, TransientError)
                else RemoteTerminalError if isinstance(exc, TerminalError) else RemoteJobError)
        return kind(f"{type(exc).__name__}: {text} (the serve log has the traceback)")


class DriverService:
    """One warm SparkSession serving jobs over an authenticated Unix socket (module docstring)."""

    def __init__(self, session: Callable[[], SparkSession],
                 on_batch: Callable[[str, BatchResult, float], None] | None = None) -> None:
        """``on_batch(pipeline, result, seconds)`` is told each batch an ingest commits (serve's metrics)."""
        self._session_factory = session
        self._on_batch = on_batch
        self._session: SparkSession | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self.directory = Path(tempfile.mkdtemp(prefix="tidemark-driver-"))  # 0700; a short path for AF_UNIX
        self._key = secrets.token_bytes(32)
        (self.directory / "key").write_bytes(self._key)
        self._listener = Listener(str(self.directory / "socket"), family="AF_UNIX", authkey=self._key)
        self._closed = threading.Event()

    def start(self) -> Self:
        """Warm the session in the background, accept requests, and name the socket in ``os.environ``."""
        threading.Thread(target=self._warm, daemon=True, name="driver-warm").start()
        threading.Thread(target=self._accept, daemon=True, name="driver-accept").start()
        os.environ[ENV] = str(self.directory)
        return self

    def stop(self) -> None:
        os.environ.pop(ENV, None)
        self._closed.set()
        self._listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _warm(self) -> None:
        started = time.monotonic()
        try:
            self._session = self._session_factory()
            log.info("warm driver ready in %.1fs: served runs use its Spark session", time.monotonic() - started)
        except BaseException as error:
            self._failed = error
            log.exception("the warm driver's Spark session did not start")
        finally:
            self._ready.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, AuthenticationError) as error:
                if self._closed.is_set():
                    return
                log.warning("a connection to the warm driver was refused (%s: %s); ignored",
                            type(error).__name__, error)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="driver-request").start()

    def _lock(self, slot: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[slot]

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                request = conn.recv()
                kind, kwargs, client = request["kind"], dict(request["kwargs"]), dict(request.get("client", {}))
            except (EOFError, OSError, KeyError, TypeError, pickle.UnpicklingError):
                log.warning("a malformed request to the warm driver was dropped")
                return
            try:
                reply = self._run(conn, kind, kwargs, client)
            except BaseException as error:
                if not isinstance(error, TransientError | TerminalError):
                    log.exception("%s of %s failed in the warm driver", kind, kwargs.get("pipeline"))
                reply = ("error", _portable(error))
            if reply is None:
                return
            try:
                conn.send(reply)
            except OSError:
                log.warning("%s of %s ended after its flow run went away", kind, kwargs.get("pipeline"))

    def _run(self, conn: Connection, kind: str, kwargs: dict[str, Any],
             client: Mapping[str, Any]) -> tuple[str, Any] | None:
        """The job's reply, or None when its flow run went away (the job then was cancelled)."""
        if kind not in JOBS:
            raise TerminalError(f"the warm driver knows no job {kind!r} (one of {', '.join(JOBS)})")
        pipeline = str(kwargs.get("pipeline"))
        lock = self._lock(slot_of(kind, pipeline))
        while not lock.acquire(timeout=_CANCEL_EVERY):
            if self._gone(conn):
                log.info("%s of %s dropped: its flow run went away while it waited for the previous one",
                         kind, pipeline)
                return None
        try:
            self._ready.wait()
            if self._failed is not None or self._session is None:
                raise TerminalError(f"the warm driver's Spark session did not start ({self._failed!r}); "
                                    "see the serve log, fix the cause and restart `tidemark serve`")
            return self._supervise(conn, self._session, kind, pipeline, kwargs, client)
        finally:
            lock.release()

    def _supervise(self, conn: Connection, spark: SparkSession, kind: str, pipeline: str,
                   kwargs: dict[str, Any], client: Mapping[str, Any]) -> tuple[str, Any] | None:
        group = f"tidemark-{kind}-{pipeline}-{uuid.uuid4().hex[:8]}"
        outcome: dict[str, Any] = {}

        def work() -> None:
            sc = spark.sparkContext
            sc.setJobGroup(group, f"{kind} of {pipeline} (flow run {client.get('flow_run')})", interruptOnCancel=True)
            sc.setLocalProperty("spark.scheduler.pool", pipeline)
            hooks: dict[str, Any] = {"keep_warm": True} if kind == "ingest" else {}
            if kind == "ingest" and self._on_batch:
                hooks["on_batch"] = partial(self._on_batch, pipeline)
            try:
                outcome["result"] = JOBS[kind](spark, **kwargs, **hooks)
            except BaseException as error:  # noqa: BLE001 - handed to the request's thread
                outcome["error"] = error

        log.info("running %s of %s for flow run %s (pid %s)", kind, pipeline, client.get("flow_run"),
                 client.get("pid"))
        worker = threading.Thread(target=work, daemon=True, name=f"driver-{kind}-{pipeline}")
        worker.start()
        gone = False
        while worker.is_alive():
            worker.join(_CANCEL_EVERY)
            if worker.is_alive() and (gone or self._gone(conn)):
                if not gone:
                    log.warning("the flow run of %s of %s (pid %s) went away: cancelling its Spark jobs",
                                kind, pipeline, client.get("pid"))
                gone = True
                spark.sparkContext.cancelJobGroup(group)  # again each time: the job may start another
        if gone:
            log.warning("%s of %s cancelled (%s); its next run recovers the batch", kind, pipeline,
                        type(outcome["error"]).__name__ if "error" in outcome else "it had finished")
            return None
        if "error" in outcome:
            raise outcome["error"]
        return ("ok", outcome["result"])

    @staticmethod
    def _gone(conn: Connection) -> bool:
        """Whether the client closed its end (a client never sends a second message)."""
        try:
            if not conn.poll(0):
                return False
            conn.recv()
        except (EOFError, OSError):
            return True
        return True


def run(kind: str, **kwargs: Any) -> dict[str, Any] | None:
    """Run job ``kind`` in the serve process's warm driver; None when this process has none (run it here)."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    from prefect.runtime import flow_run

    where = Path(directory)
    try:
        conn = Client(str(where / "socket"), family="AF_UNIX", authkey=(where / "key").read_bytes())
    except (OSError, EOFError) as error:
        raise DriverUnavailableError(f"the warm driver of `tidemark serve` ({where}) cannot be reached: {error}; "
                                     "a run started by serve ends with it (restart `tidemark serve`)") from None
    with conn:
        conn.send({"kind": kind, "kwargs": kwargs, "client": {"pid": os.getpid(), "flow_run": flow_run.get_id()}})
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            raise DriverUnavailableError(f"the warm driver went away during {kind} of {kwargs.get('pipeline')} "
                                         "(serve stopped or was killed); the next run recovers the batch") from None
    if status == "ok":
        return dict(payload)
    raise payload
