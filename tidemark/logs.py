"""Where the CLI's log lines go: Tidemark's own warnings on the console, the rest to a file.

An operator reads the console: each command's one line per step, and Tidemark's own
warnings and errors. What Spark, py4j, librdkafka, Great Expectations and Prefect say is
for diagnosis, so it goes to ``TIDEMARK_HOME/logs/`` (``tidemark.log``; Spark's driver
log is ``spark.log`` beside it), and the console names that file once, at the first
line it kept from you. ``-v`` shows everything on the console as well.

Only the CLI configures this. Tests, benchmarks and library callers keep Python's and
Spark's defaults (everything on stderr), which is what a CI log needs.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
from collections.abc import Iterator
from pathlib import Path

#: Top-level packages whose records are Tidemark's own.
OWN = frozenset({"tidemark", "pipelines", "connectors", "outbox", "offsets", "orchestration", "quality", "infra",
                 "bench", "__main__"})

#: Set by :func:`configure`: Spark's driver logs to this file (``infra.spark``), librdkafka through
#: Python logging (``connectors.kafka_config``), instead of both writing to stderr.
LOG_DIR_ENV = "TIDEMARK_LOG_DIR"
VERBOSE_ENV = "TIDEMARK_VERBOSE"

#: Every log file of a process is rotated at this size and keeps this many old files
#: (``tidemark.log.1`` the newest): a follower or serve runs for months.
ROTATE_BYTES = 20 * 1024 * 1024
ROTATE_KEEP = 3

#: The Spark driver's log in the log directory: log4j writes it (``infra.spark``) and
#: :func:`jvm_output_to_log` appends the JVM's own stdout and stderr to it.
SPARK_LOG = "spark.log"


class _OwnOnly(logging.Filter):
    """Passes Tidemark's records; diverts the rest to the file, naming it once on the console."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.told = False

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "file_only", False):
            return False  # e.g. an internal error's traceback: the console has its one line
        if record.name.split(".", 1)[0] in OWN:
            return True
        if record.levelno >= logging.WARNING and not self.told:
            self.told = True
            sys.stderr.write(f"tidemark: other components' messages are in {self.path} (-v shows them here)\n")
        return False


def configure(home: Path, *, verbose: bool = False, debug: bool = False,
              formatter: logging.Formatter | None = None) -> Path:
    """Route the process's logging (and, through the environment, Spark's and librdkafka's); returns the file."""
    directory = home / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tidemark.log"
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    to_file = logging.handlers.RotatingFileHandler(path, maxBytes=ROTATE_BYTES, backupCount=ROTATE_KEEP)
    to_file.setFormatter(text)
    to_file.setLevel(logging.DEBUG if debug else logging.INFO)
    console = logging.StreamHandler()
    console.setFormatter(formatter or text)
    console.setLevel(logging.DEBUG if debug else logging.INFO if verbose or formatter else logging.WARNING)
    if not verbose:
        console.addFilter(_OwnOnly(path))
    root = logging.getLogger()
    root.handlers = [to_file, console]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    for noisy in ("py4j", "urllib3", "httpx", "httpcore", "asyncio", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    os.environ[LOG_DIR_ENV] = str(directory)
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    return path


@contextlib.contextmanager
def jvm_output_to_log() -> Iterator[Path | None]:
    """While inside, file descriptors 1 and 2 go to ``spark.log``: a JVM started meanwhile keeps them.

    The driver JVM is a child process that inherits our descriptors when it starts
    (``infra.spark.build_session``). What it writes there outside log4j is not for the
    operator's console: the launcher's ``WARNING: Using incubator modules`` (Spark asks for
    ``jdk.incubator.vector``, and the JVM announces it before any logging starts), and Delta
    commands that print instead of logging (VACUUM's "Deleted N files and directories").
    Yields the file, so that a JVM that fails to start can be explained from it. Only when
    the CLI routed logs (:func:`configure`, without ``-v``); otherwise a no-op yielding None.
    Once log4j rolls ``spark.log`` over, these rare lines follow the renamed file.
    """
    directory = os.environ.get(LOG_DIR_ENV)
    if not directory or os.environ.get(VERBOSE_ENV):
        yield None
        return
    path = Path(directory) / SPARK_LOG
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield path
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
