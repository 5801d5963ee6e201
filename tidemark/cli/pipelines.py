"""`tidemark ingest`, `backfill` and `maintain`: the commands that write a pipeline's tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tidemark.cli.context import CONFIG, metrics_arguments, pipeline_of, serve_metrics, servers_answering
from tidemark.cli.output import table
from tidemark.settings import settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    ingest = sub.add_parser("ingest", parents=[CONFIG],
                            help="ingest a pipeline's topics into its Delta table, exactly once")
    ingest.add_argument("pipeline")
    ingest.add_argument("--follow", action="store_true",
                        help="keep ingesting micro-batches; SIGTERM finishes the batch in flight and exits")
    metrics_arguments(ingest)
    ingest.set_defaults(func=cmd_ingest)

    backfill = sub.add_parser(
        "backfill", parents=[CONFIG],
        help="re-read Kafka into another Delta table, exactly once (re-run to resume)",
        description="Re-read stored batches' exact ranges, or everything from offsets or a time up to now, "
                    "into a new Delta table. Stops with a clear error if retention deleted the records.")
    backfill.add_argument("pipeline")
    backfill.add_argument("--into", required=True, metavar="PATH", help="the Delta table to write (a new path)")
    what = backfill.add_mutually_exclusive_group(required=True)
    what.add_argument("--batches", metavar="FIRST[-LAST]", help="stored batches, e.g. 3-7 (see `offsets show`)")
    what.add_argument("--from-offsets", metavar="SPEC", help="TOPIC:PARTITION=OFFSET,... for every partition")
    what.add_argument("--from-timestamp", metavar="ISO8601", help="e.g. 2026-01-31T00:00:00Z")
    backfill.set_defaults(func=cmd_backfill)

    maint = sub.add_parser(
        "maintain", parents=[CONFIG], help="compact and vacuum a pipeline's tables (safe while ingest runs)",
        description="OPTIMIZE the target, quarantine and ledger (bin-packing; Z-ORDER by "
                    "maintenance.zorder_by), then VACUUM with the table's retention, refused if shorter than "
                    "maintenance.time_travel_hours. Runs beside ingest: compaction never conflicts with its commits.")
    maint.add_argument("pipeline")
    maint.add_argument("--apply-properties", action="store_true",
                       help="also set the maintenance table properties on existing tables (a metadata commit: "
                            "a batch committing at that instant is retried)")
    maint.add_argument("--json", action="store_true", help="machine-readable output")
    maint.set_defaults(func=cmd_maintain)


def cmd_ingest(args: argparse.Namespace) -> int:
    from connectors.kafka_config import librdkafka_config
    from infra.spark import build_session
    from offsets.frames import BatchResult
    from offsets.ledger import read_last
    from orchestration.metrics import never_raising
    from pipelines.ingest import IngestJob
    from tidemark.cli.progress import IngestProgress, on_terminal, planned_offsets
    from tidemark.signals import stop_on_signals

    config, pipeline, bootstrap = servers_answering(args) if args.follow else pipeline_of(args)
    metrics = serve_metrics(args)
    if metrics is not None:  # scrapes answer while Spark starts
        metrics.watch_pipelines([pipeline], librdkafka_config(config.kafka, bootstrap),
                                settings().home_dir / "quality")
    spark = build_session(settings(), f"tidemark-ingest-{pipeline.name}")
    try:
        job = IngestJob(spark, config, pipeline, bootstrap)
        hooks: list[Callable[[BatchResult, float], None]] = []
        if metrics is not None:
            metrics.count_batches(pipeline.name)
            hooks.append(never_raising(lambda result, seconds: metrics.batch(pipeline.name, result, seconds)))

        def each_batch(result: BatchResult, seconds: float) -> None:
            for hook in hooks:
                hook(result, seconds)

        job.on_batch = each_batch
        if metrics is not None:
            job.on_outage = lambda down: metrics.kafka_outage(pipeline.name, down)
            job.on_stall = lambda seconds: metrics.stalled.labels(pipeline.name).set(seconds)
        if args.follow:
            report = job.follow(stop_on_signals())
        elif on_terminal():
            bounds = job.snapshot()
            last = read_last(pipeline.ledger_path, pipeline.name)
            with IngestProgress(spark, planned_offsets(bounds, last.ends() if last else {}), pipeline.name,
                                per_batch=pipeline.max_records_per_batch) as bar:
                hooks.append(bar.batch)
                report = job.run_to(bounds)
        else:
            report = job.run_bounded()
    finally:
        spark.stop()
    print(f"{pipeline.name}: {report.summary()} -> {pipeline.target}")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from infra.spark import build_session
    from pipelines.backfill import Backfill, parse_batches, parse_offsets
    from tidemark.cli.progress import IngestProgress
    from tidemark.config import TimestampStart
    from tidemark.errors import ConfigError

    config, pipeline, bootstrap = pipeline_of(args)
    # Validate the cheap things before a JVM starts.
    batches = parse_batches(args.batches) if args.batches else None
    offsets = parse_offsets(args.from_offsets) if args.from_offsets else None
    when = None
    if args.from_timestamp:
        try:
            when = TimestampStart(timestamp=args.from_timestamp).timestamp
        except ValueError:
            raise ConfigError(f"--from-timestamp {args.from_timestamp!r}: give ISO 8601 with a zone, "
                              "e.g. 2026-01-31T00:00:00Z") from None
    spark = build_session(settings(), f"tidemark-backfill-{pipeline.name}")
    try:
        backfill = Backfill(spark, config, pipeline, bootstrap, args.into)
        with IngestProgress(spark, None, f"backfill {pipeline.name}") as bar:
            backfill.on_batch = bar.batch
            if batches:
                report = backfill.stored_batches(*batches)
            elif offsets:
                report = backfill.from_offsets(offsets)
            else:
                assert when is not None
                report = backfill.from_timestamp(when)
    finally:
        spark.stop()
    print(f"{pipeline.name} backfill: {report.summary()} -> {args.into}")
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    import json

    from infra.spark import build_session
    from pipelines.maintain import maintain

    _, pipeline, _ = pipeline_of(args)
    spark = build_session(settings(), f"tidemark-maintain-{pipeline.name}")
    try:
        report = maintain(spark, pipeline, apply_properties=args.apply_properties)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    rows = [(t.role, t.skipped or f"{t.files_before} → {t.files_after}", str(t.compacted_away), str(t.vacuumed),
             "-" if t.retain_hours is None else f"{t.retain_hours:g} h", str(t.version), f"{t.seconds:.1f}")
            for t in report.tables]
    print(table(rows, ("table", "files", "compacted away", "vacuumed", "retention", "version", "seconds")))
    promise = pipeline.maintenance.time_travel_hours
    print(f"retention {report.retain_hours:g} h: versions of the last {promise:g} hours stay readable (the promise)")
    return 0
