"""`tidemark demo`: the end-to-end pipeline on the embedded stack."""

from __future__ import annotations

import argparse

from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded stack")
    demo.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    demo.add_argument("--duration", type=float, default=60, metavar="SECONDS",
                      help="how long the sample application writes (default 60)")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestration.smoke import run_demo

    return run_demo(settings(), keep=args.keep, duration=args.duration)
