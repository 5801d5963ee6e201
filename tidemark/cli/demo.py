"""`tidemark demo`: the end-to-end pipeline on the embedded stack."""

from __future__ import annotations

import argparse
import os

from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded stack")
    demo.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    demo.add_argument("--duration", type=float, default=60, metavar="SECONDS",
                      help="how long the sample application writes (default 60)")
    demo.add_argument("--format", choices=("json", "avro", "protobuf"), default="json", dest="value_format",
                      help="the events' values in Kafka: JSON (default), or Avro or Protobuf through the "
                           "embedded schema registry")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestration.smoke import run_demo

    if args.value_format != "json":
        # The stack runs its schema registry; the relay's process, started by the supervisor, inherits it.
        os.environ["TIDEMARK_REGISTRY__ENABLED"] = "true"
        settings.cache_clear()
    return run_demo(settings(), keep=args.keep, duration=args.duration, value_format=args.value_format)
