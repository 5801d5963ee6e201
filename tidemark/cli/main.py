"""The ``tidemark`` command: the parser of every group, and errors mapped to exit codes.

A :class:`~tidemark.errors.TidemarkError` prints its message (which says what to do next)
and exits with its code; anything else is a bug and says so. Tracebacks only with
``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from tidemark.cli import acls, demo, offsets, pipelines, quality, relay, serve, stack
from tidemark.errors import TidemarkError
from tidemark.settings import settings


class JsonFormatter(logging.Formatter):
    """One JSON object per log record, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        data = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


#: The distribution pyproject.toml names; ``--version`` reports what pip installed of it.
DISTRIBUTION = "tidemark"


class VersionAction(argparse.Action):
    """``--version``, looked up only when asked: the lookup scans every installed distribution
    (about 0.2 s here), which no other command should pay at start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version(DISTRIBUTION)
        except PackageNotFoundError:
            parser.exit(1, f"tidemark: the {DISTRIBUTION} distribution is not installed (run from a source tree?); "
                           "install it with `pip install -e .`\n")
        print(f"tidemark {found}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidemark", description="Exactly-once Kafka to Delta Lake ingestion.")
    parser.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show Spark's, librdkafka's, GX's and Prefect's messages here "
                             "(always in TIDEMARK_HOME/logs/)")
    parser.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line, "
                                                                   "INFO and up, on stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (stack, pipelines, offsets, quality, relay, serve, acls, demo):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from tidemark.logs import configure

    try:
        home = settings().home_dir
    except TidemarkError as exc:  # settings invalid in the environment: say which, no traceback
        print(f"tidemark: {exc}", file=sys.stderr)
        return exc.exit_code
    log_file = configure(home, verbose=args.verbose, debug=args.debug,
                         formatter=JsonFormatter() if args.log_json else None)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except TidemarkError as exc:
        if args.debug:
            raise
        print(f"tidemark: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tidemark: interrupted", file=sys.stderr)
        return 130
    except Exception:
        if args.debug:
            raise
        import traceback

        logging.getLogger("tidemark.cli").exception("internal error", extra={"file_only": True})
        last = traceback.format_exc().strip().splitlines()[-1]
        print(f"tidemark: internal error: {last}\nthe traceback is in {log_file}; rerun with --debug to see it "
              "here, and report it", file=sys.stderr)
        return 70  # EX_SOFTWARE
