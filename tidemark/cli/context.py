"""What a command acts on: its pipeline or relay, resolved and checked, and its metrics endpoint."""

from __future__ import annotations

import argparse

from tidemark.errors import ConfigError
from tidemark.settings import settings

#: The ``--config`` option, declared once: every command that reads ``tidemark.yaml`` takes
#: it as a parent parser (``sub.add_parser(..., parents=[CONFIG])``).
CONFIG = argparse.ArgumentParser(add_help=False)
CONFIG.add_argument("--config", default="tidemark.yaml", metavar="FILE",
                    help="the configuration file (default ./tidemark.yaml)")


def pipeline_of(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(config, pipeline, bootstrap servers) for commands that act on one pipeline."""
    from orchestration.context import pipeline_context

    ctx = pipeline_context(args.config, args.pipeline)
    return ctx.config, ctx.pipeline, ctx.bootstrap


def servers_answering(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """:func:`pipeline_of` for a follower: a server that does not answer yet (Kafka, the object
    store) is waited for, with a line each time, as the follower waits for one mid-run."""
    import logging
    import time

    from tidemark.errors import ServiceUnavailableError

    waits = 0
    while True:
        try:
            found = pipeline_of(args)
        except ServiceUnavailableError as exc:
            waits += 1
            pause = min(30.0, 2.0 ** min(waits, 5))
            logging.getLogger("tidemark.follow").warning("%s; --follow waits %.0f s and asks again (wait %d)",
                                                         exc, pause, waits)
            time.sleep(pause)
            continue
        if waits:
            logging.getLogger("tidemark.follow").warning("the servers answer after %d wait(s); starting", waits)
        return found


def metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (docs/running.md, Metrics)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 for all)")


def serve_metrics(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The process's metrics, serving from now on, or None without ``--metrics-port``."""
    if args.metrics_port is None:
        return None
    from orchestration.metrics import Metrics

    metrics = Metrics()
    try:
        metrics.serve(args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_host}: "
                          f"{exc.strerror}; choose a free port") from None
    return metrics


def relay_of(args: argparse.Namespace, *, check: bool = True):  # type: ignore[no-untyped-def]
    """(config, PostgreSQL DSN, librdkafka properties) for the outbox and relay commands."""
    from pathlib import Path

    from connectors.kafka_config import librdkafka_config
    from orchestration.context import load, postgres_named_by, preflight, with_stack_security
    from tidemark.config import TidemarkConfig

    path = Path(args.config)
    # The relay runs on defaults (embedded stack, table public.outbox) when there is no config file.
    config = load(path) if path.exists() or args.config != "tidemark.yaml" else with_stack_security(TidemarkConfig())
    if args.relay_id:
        config = config.model_copy(update={"relay": config.relay.model_copy(update={"id": args.relay_id})})
    config = config.for_relay()
    secret = config.postgres.dsn or settings().postgres.dsn
    dsn = secret.get_secret_value() if secret else None
    bootstrap = config.kafka.bootstrap_servers
    if dsn is None or bootstrap is None:
        from infra.stack import Stack

        endpoints = Stack(settings()).endpoints()
        dsn, bootstrap = dsn or endpoints.postgres_dsn, bootstrap or endpoints.kafka_bootstrap
    if not check:  # a caller that only wants the database's address (status, serve's metrics)
        return config, dsn, librdkafka_config(config.kafka, bootstrap)
    preflight(config, bootstrap)
    from connectors.preflight import check_postgres

    check_postgres(dsn, named_by=postgres_named_by(config))
    return config, dsn, librdkafka_config(config.kafka, bootstrap)
