"""`tidemark serve` and `tidemark status`: the scheduled pipelines, and one screen of their state."""

from __future__ import annotations

import argparse

from tidemark.cli.context import CONFIG, metrics_arguments, relay_of, serve_metrics
from tidemark.cli.output import size, table
from tidemark.errors import ConfigError
from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    serve = sub.add_parser("serve", parents=[CONFIG],
                           help="serve the pipelines' Prefect deployments (ingest and audit "
                                         "schedules, backfill) until SIGTERM")
    serve.add_argument("--relay", action="store_true", help="also supervise the outbox relay "
                                                            "(restarted with backoff on crash)")
    serve.add_argument("--no-warm-driver", dest="warm_driver", action="store_false",
                       help="start a Spark driver per run instead of running every run in serve's own warm one")
    metrics_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    status_p = sub.add_parser("status", parents=[CONFIG],
                              help="one screen: each pipeline's offsets, LSO, lag, last batch, "
                                             "last quality verdict; the relay's lag")
    status_p.add_argument("--no-relay", dest="relay", action="store_false", help="skip the relay's section")
    status_p.add_argument("--json", action="store_true", help="machine-readable output")
    status_p.set_defaults(func=cmd_status)


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from infra.prefect_server import check_api
    from infra.stack import Stack
    from orchestration.context import load, preflight, resolve_bootstrap

    config = load(args.config)
    if not config.pipelines and not args.relay:
        raise ConfigError(f"{args.config} declares no pipelines and --relay was not given: nothing to serve")
    bootstrap = resolve_bootstrap(config)
    for p in config.pipelines:  # each server the runs need answers now, as each pipeline connects
        preflight(config.for_pipeline(p.name), bootstrap)
    # With --relay, the supervised `relay run` checks its own servers as it starts.
    stack = Stack(settings())
    server = stack.prefect()
    if server is None:
        check_api(os.environ["PREFECT_API_URL"])
    os.environ["PREFECT_API_URL"] = stack.prefect_api()  # before Prefect reads its settings
    from orchestration.serve import serve_all

    metrics = serve_metrics(args)
    if metrics is not None:
        from connectors.kafka_config import librdkafka_config
        from orchestration.context import resolve_bootstrap

        metrics.watch_pipelines(config.pipelines, librdkafka_config(config.kafka, resolve_bootstrap(config)),
                                settings().home_dir / "quality")
        for p in config.pipelines:
            metrics.count_batches(p.name)
        if args.relay:
            _, dsn, _ = relay_of(argparse.Namespace(config=args.config, relay_id=None), check=False)
            metrics.watch_relay(config.relay, dsn)
    where = server.ui_url if server else os.environ["PREFECT_API_URL"]
    print(f"serving {len(config.pipelines)} pipeline(s){' and the relay' if args.relay else ''}; "
          f"Prefect UI {where}; stop with Ctrl-C or SIGTERM", flush=True)
    on_batch = None
    if metrics is not None and args.warm_driver:  # the runs' batches are committed in this process
        from functools import partial

        from offsets.frames import BatchResult
        from orchestration.metrics import never_raising

        def on_batch(pipeline: str, result: BatchResult, seconds: float) -> None:
            never_raising(partial(metrics.batch, pipeline))(result, seconds)
    serve_all(config, Path(args.config), relay=args.relay, warm_driver=args.warm_driver, on_batch=on_batch)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from orchestration.context import PipelineContext, load, preflight, resolve_bootstrap
    from orchestration.status import pipeline_status, relay_summary
    from tidemark.storage import check_reachable

    config = load(args.config)
    check_reachable([path for p in config.pipelines for path in (p.target, p.quarantine_path, p.ledger_path)])
    bootstrap = resolve_bootstrap(config)
    secured = any(config.for_pipeline(p.name).kafka.security.protocol != "PLAINTEXT" for p in config.pipelines)
    if secured:  # each pipeline as its own principal, if it has one
        for p in config.pipelines:
            preflight(config.for_pipeline(p.name), bootstrap, p.topics)
    else:
        preflight(config, bootstrap)
    quality_dir = settings().home_dir / "quality"
    statuses = [pipeline_status(PipelineContext(config.for_pipeline(p.name), p, bootstrap), quality_dir)
                for p in config.pipelines]
    relay = None
    if args.relay:
        _, dsn, _ = relay_of(argparse.Namespace(config=args.config, relay_id=None), check=False)
        relay = relay_summary(config, dsn)
    if args.json:
        print(json.dumps({"pipelines": [s.to_dict() for s in statuses], "relay": relay}, indent=2))
        return 0
    rows = [(s.name, "-" if s.lag is None else str(s.lag), s.last_batch, s.schema, s.quality,
             s.problem or (f"holds back {s.held}" if s.held and s.lag else "ok")) for s in statuses]
    print(table(rows, ("pipeline", "lag (offsets)", "last batch", "schema", "last quality verdict", "state")))
    parts = [(s.name, f"{x.topic}[{x.partition}]", "-" if x.next_offset is None else str(x.next_offset),
              str(x.lso), str(x.lag)) for s in statuses for x in s.partitions]
    if parts:
        print()
        print(table(parts, ("pipeline", "partition", "committed (next offset)", "LSO", "lag")))
    shapes = [(s.name, role, str(t.version), f"{t.files:,}", size(t.mean_file_bytes), size(t.bytes),
               str(t.oldest_readable_version), s.maintained) for s in statuses for role, t in s.tables.items()]
    if shapes:
        print()
        print(table(shapes, ("pipeline", "table", "version", "files", "mean file", "bytes", "readable from",
                              "last maintained")))
    if relay is not None:
        print()
        print(table(list(relay.items()), ("relay", "state")))
    return 0
