"""`tidemark stack`: the embedded servers, started and stopped as local processes."""

from __future__ import annotations

import argparse
import time

from tidemark.cli.output import table
from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    stack = sub.add_parser("stack", help="the local stack: embedded Kafka (KRaft) and PostgreSQL")
    stack_sub = stack.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, func, text in (
        ("up", cmd_stack_up, "start the embedded servers (idempotent)"),
        ("down", cmd_stack_down, "stop the embedded servers (idempotent)"),
        ("status", cmd_stack_status, "versions and addresses of Kafka, Spark, Delta, PostgreSQL"),
    ):
        p = stack_sub.add_parser(name, help=text)
        p.set_defaults(func=func)
        if name == "up":
            p.add_argument("--prefect", action="store_true", help="also start the embedded Prefect server (API "
                                                                  "and UI; `tidemark serve` starts it when needed)")


def cmd_stack_up(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    started = time.monotonic()
    stack = Stack(settings())
    endpoints = stack.up()
    prefect = stack.prefect_api() if args.prefect else None
    print(f"stack up in {time.monotonic() - started:.1f}s")
    sec = endpoints.kafka_security
    how = "" if sec.protocol == "PLAINTEXT" else f" ({sec.protocol}; CA {sec.ssl_ca_location}; " + (
        f"admin's password in {sec.sasl_password_file})" if sec.sasl_password_file
        else f"admin's certificate {sec.ssl_certificate_location})")
    print(f"  kafka     {endpoints.kafka_bootstrap}{how}")
    print(f"  postgres  {endpoints.postgres_dsn}")
    s3 = stack.s3()
    if s3:
        print(f"  s3        {s3.endpoint} (bucket {s3.bucket}; credentials in {s3.credentials})")
    registry = stack.registry()
    if registry:
        print(f"  registry  {registry.url} (compatibility BACKWARD; data in {registry.data})")
    if prefect:
        print(f"  prefect   {prefect} (UI {prefect.removesuffix('/api')})")
    print("next: `tidemark stack status`; stop with `tidemark stack down`")
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    Stack(settings()).down()
    print("stack down")
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    print(table(Stack(settings()).status(), ("component", "version", "address / state")))
    return 0
