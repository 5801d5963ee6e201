"""The ``tidemark`` command line.

One function per command; :func:`main` maps errors to exit codes. A
:class:`~tidemark.errors.TidemarkError` prints its message (which says what to do next)
and exits with its code; anything else is a bug and says so. Tracebacks only with
``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tidemark.errors import ConfigError, TidemarkError
from tidemark.settings import settings

if TYPE_CHECKING:
    from offsets.ledger import Intent


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A table: drawn by rich on a terminal, plain aligned columns when piped (scripts parse those)."""
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table

        table = Table(*header, box=box.SIMPLE_HEAD)
        for row in rows:
            table.add_row(*map(str, row))
        console = Console()
        with console.capture() as captured:
            console.print(table)
        return captured.get().rstrip("\n")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


class JsonFormatter(logging.Formatter):
    """One JSON object per log record, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        data = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


# -- stack --------------------------------------------------------------------------


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

    print(_table(Stack(settings()).status(), ("component", "version", "address / state")))
    return 0


# -- ingest and offsets ------------------------------------------------------------


def _pipeline_context(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(config, pipeline, bootstrap servers) for commands that act on one pipeline."""
    from tidemark.context import pipeline_context

    ctx = pipeline_context(args.config, args.pipeline)
    return ctx.config, ctx.pipeline, ctx.bootstrap


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (docs/operations.md, Metrics)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 for all)")


def _metrics(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The process's metrics, serving from now on, or None without ``--metrics-port``."""
    if args.metrics_port is None:
        return None
    from tidemark.metrics import Metrics

    metrics = Metrics()
    try:
        metrics.serve(args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_host}: "
                          f"{exc.strerror}; choose a free port") from None
    return metrics


def cmd_ingest(args: argparse.Namespace) -> int:
    from connectors.kafka_config import librdkafka_config
    from infra.spark import build_session
    from offsets.ledger import read_last
    from offsets.protocol import BatchResult
    from pipelines.ingest import IngestJob
    from tidemark.metrics import never_raising
    from tidemark.progress import IngestProgress, on_terminal, planned_offsets
    from tidemark.signals import stop_on_signals

    config, pipeline, bootstrap = _pipeline_context(args)
    metrics = _metrics(args)
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
    from tidemark.config import TimestampStart
    from tidemark.errors import ConfigError
    from tidemark.progress import IngestProgress

    config, pipeline, bootstrap = _pipeline_context(args)
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


def _g3(intent: Intent) -> str:
    """How a batch kept source transactions whole: its write's check, or a scan and what the cut did."""
    if intent.guarded:
        return "checked in write: none"
    if intent.txns is None and not intent.held and not intent.released:
        return "-"
    seen = "?" if intent.txns is None else str(intent.txns)
    missing = f" ({len(intent.waiting)} missing events)" if intent.waiting else ""
    return f"scanned: {seen}, {intent.held} held{missing}, {len(intent.released)} released"


def cmd_maintain(args: argparse.Namespace) -> int:
    import json

    from infra.spark import build_session
    from pipelines.maintain import maintain

    _, pipeline, _ = _pipeline_context(args)
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
    print(_table(rows, ("table", "files", "compacted away", "vacuumed", "retention", "version", "seconds")))
    promise = pipeline.maintenance.time_travel_hours
    print(f"retention {report.retain_hours:g} h: versions of the last {promise:g} hours stay readable (the promise)")
    return 0


def cmd_offsets_show(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from connectors.kafka_config import librdkafka_config
    from offsets.lag import partition_lags
    from offsets.ledger import read_ledger
    from offsets.tables import txn_version

    config, pipeline, bootstrap = _pipeline_context(args)
    newest = txn_version(pipeline.ledger_path, pipeline.name)  # no JVM: delta-rs reads the ledger
    intents = [] if newest is None else read_ledger(pipeline.ledger_path, pipeline.name,
                                                    first=max(0, newest - max(args.last, 1) + 1), last=newest)
    committed = intents[-1].ends() if intents else {}
    lags = partition_lags(librdkafka_config(config.kafka, bootstrap), pipeline, committed)
    shown = intents[-args.last:] if args.last > 0 else []
    if args.json:
        print(json.dumps({
            "pipeline": pipeline.name, "ledger": pipeline.ledger_path, "newest_batch": newest,
            "partitions": [asdict(x) for x in lags],
            "batches": [{"batch": i.batch_id, "planned_at": i.planned_at.isoformat(),
                         "offsets": sum(r.span for r in i.ranges), "g3": _g3(i),
                         "ranges": [asdict(r) for r in i.ranges if r.span]} for i in shown]}, indent=2))
        return 0
    rows = [(x.topic, str(x.partition), "-" if x.next_offset is None else str(x.next_offset), str(x.lso), str(x.lag))
            for x in lags]
    print(_table(rows, ("topic", "partition", "next offset", "LSO", "lag (offsets)")))
    where = "none yet" if newest is None else f"newest #{newest}"
    print(f"\nbatches ({where} in ledger {pipeline.ledger_path}; last {args.last} shown):")
    history = [(str(i.batch_id), i.planned_at.isoformat(), str(sum(r.span for r in i.ranges)),
                _g3(i), " ".join(f"{r.topic}[{r.partition}]:{r.start}-{r.end}" for r in i.ranges if r.span))
               for i in shown]
    print(_table(history, ("batch", "planned at", "offsets", "G3 (multi-event txns)", "ranges")))
    print("\nnote: the newest batch is committed once `tidemark ingest` has run past it (a crash replays it)")
    return 0


# -- quality ------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from connectors.kafka_config import librdkafka_config, spark_options
    from infra.spark import build_session
    from quality.audit import audit

    config, pipeline, bootstrap = _pipeline_context(args)
    docs = Path(args.docs) if args.docs else settings().home_dir / "quality"
    spark = build_session(settings(), f"tidemark-check-{pipeline.name}")
    try:
        report = audit(spark, pipeline, kafka_options=spark_options(config.kafka, bootstrap),
                       client_config=librdkafka_config(config.kafka, bootstrap), docs_dir=docs)
    finally:
        spark.stop()
    rows = [(v.suite, v.check, "PASS" if v.passed else "FAIL", v.observed) for v in report.verdicts]
    print(_table(rows, ("suite", "check", "verdict", "observed")))
    print(f"\nData Docs: file://{report.docs}")
    if report.passed:
        print(f"{pipeline.name}: all {len(rows)} checks passed")
        return 0
    failed = sum(1 for v in report.verdicts if not v.passed)
    print(f"{pipeline.name}: {failed} of {len(rows)} checks FAILED; the Data Docs list the offending rows")
    return 1


# -- outbox and relay ---------------------------------------------------------------


def _relay_context(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(config, PostgreSQL DSN, librdkafka properties) for the outbox and relay commands."""
    from pathlib import Path

    from connectors.kafka_config import librdkafka_config
    from tidemark.config import TidemarkConfig
    from tidemark.context import load, preflight, with_stack_security

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
    preflight(config, bootstrap)
    from connectors.preflight import check_postgres

    check_postgres(dsn)
    return config, dsn, librdkafka_config(config.kafka, bootstrap)


def cmd_outbox_init(args: argparse.Namespace) -> int:
    from outbox.schema import TableName, init_outbox

    config, dsn, client = _relay_context(args)
    relay = config.relay
    created = init_outbox(dsn, table=TableName.parse(relay.table), publication=relay.publication_name,
                          slot=relay.slot_name, create_slot=not args.reset_relay)
    print(f"outbox {relay.table}: " + (", ".join(f"created {c}" for c in created) or "already set up"))
    if args.reset_relay:
        from outbox.reset import reset_relay

        done = reset_relay(relay, dsn=dsn, client_config=client)
        print(f"relay {relay.id} reset: slot {done.slot} recreated at {done.start_lsn}; {done.requeued_rows} outbox "
              f"row(s) of {done.requeued_transactions} source transaction(s) requeued; position moved to "
              f"{done.start_lsn}")
    print(f"next: add events with outbox.schema.add_event(...) and run `tidemark relay run --relay-id {relay.id}`")
    return 0


def cmd_relay_dead_letter(args: argparse.Namespace) -> int:
    import psycopg2

    from outbox.deadletter import dead_letter_transaction
    from outbox.schema import TableName

    config, dsn, _ = _relay_context(args)
    relay = config.relay
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            moved = dead_letter_transaction(cur, TableName.parse(relay.table), TableName.parse(relay.dead_letter_table),
                                            args.xid, args.reason)
            cur.execute(f"SELECT count(*) FROM {TableName.parse(relay.dead_letter_table).sql} "
                        "WHERE xid = %s", (args.xid,))
            total = int(cur.fetchone()[0])
    finally:
        conn.close()
    if total == 0:
        raise ConfigError(f"no outbox row of source transaction {args.xid} in {relay.table}: check the xid the "
                          "relay's error named (it may be relayed or dead-lettered already)")
    print(f"source transaction {args.xid}: {total} event(s) in {relay.dead_letter_table} ({moved} copied now); "
          f"restart the relay (`tidemark relay run`): it skips the transaction and deletes its outbox rows")
    return 0


def cmd_relay_run(args: argparse.Namespace) -> int:
    import json

    from outbox.relay import Relay
    from tidemark.signals import stop_on_signals

    config, dsn, client = _relay_context(args)
    relay = Relay(config.relay, dsn=dsn, client_config=client, replication_factor=args.replication_factor,
                  topic_partitions=args.partitions)
    metrics = _metrics(args)
    if metrics is not None:
        metrics.watch_relay(config.relay, dsn, live=relay)
    report = relay.run(stop_on_signals(), idle_exit=args.idle_exit)
    print(json.dumps({"relay": config.relay.id, "transactions": report.transactions, "events": report.events,
                      "kafka_transactions": report.kafka_transactions, "skipped_redelivered": report.skipped,
                      "deleted_rows": report.deleted, "dead_lettered": report.dead_lettered,
                      "redone": report.redone, "refenced": report.refenced, "outages": report.outages,
                      "topics": dict(report.topics)}))
    return 0


def cmd_relay_status(args: argparse.Namespace) -> int:
    from outbox.relay import relay_status

    config, dsn, client = _relay_context(args)
    status = relay_status(config.relay, dsn=dsn, client_config=client)
    print(_table(list(status.items()), ("relay", "state")))
    return 0


# -- orchestration and status -------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from infra.stack import Stack
    from tidemark.context import load

    config = load(args.config)
    if not config.pipelines and not args.relay:
        raise ConfigError(f"{args.config} declares no pipelines and --relay was not given: nothing to serve")
    stack = Stack(settings())
    server = stack.prefect()
    os.environ["PREFECT_API_URL"] = stack.prefect_api()  # before Prefect reads its settings
    from orchestration.serve import serve_all

    metrics = _metrics(args)
    if metrics is not None:
        from connectors.kafka_config import librdkafka_config
        from tidemark.context import resolve_bootstrap

        metrics.watch_pipelines(config.pipelines, librdkafka_config(config.kafka, resolve_bootstrap(config)),
                                settings().home_dir / "quality")
        for p in config.pipelines:
            metrics.count_batches(p.name)
        if args.relay:
            _, dsn, _ = _relay_context(argparse.Namespace(config=args.config, relay_id=None))
            metrics.watch_relay(config.relay, dsn)
    where = server.ui_url if server else os.environ["PREFECT_API_URL"]
    print(f"serving {len(config.pipelines)} pipeline(s){' and the relay' if args.relay else ''}; "
          f"Prefect UI {where}; stop with Ctrl-C or SIGTERM", flush=True)
    on_batch = None
    if metrics is not None and args.warm_driver:  # the runs' batches are committed in this process
        from functools import partial

        from offsets.protocol import BatchResult
        from tidemark.metrics import never_raising

        def on_batch(pipeline: str, result: BatchResult, seconds: float) -> None:
            never_raising(partial(metrics.batch, pipeline))(result, seconds)
    serve_all(config, Path(args.config), relay=args.relay, warm_driver=args.warm_driver, on_batch=on_batch)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from orchestration.status import pipeline_status, relay_summary
    from tidemark.context import PipelineContext, load, preflight, resolve_bootstrap

    config = load(args.config)
    bootstrap = resolve_bootstrap(config)
    for p in config.pipelines or [None]:  # each pipeline as its own principal, if it has one
        preflight(config.for_pipeline(p.name) if p else config, bootstrap, p.topics if p else ())
    from tidemark.storage import check_reachable

    check_reachable([path for p in config.pipelines for path in (p.target, p.quarantine_path, p.ledger_path)])
    quality_dir = settings().home_dir / "quality"
    statuses = [pipeline_status(PipelineContext(config.for_pipeline(p.name), p, bootstrap), quality_dir)
                for p in config.pipelines]
    relay = None
    if args.relay:
        _, dsn, _ = _relay_context(argparse.Namespace(config=args.config, relay_id=None))
        relay = relay_summary(config, dsn)
    if args.json:
        print(json.dumps({"pipelines": [s.to_dict() for s in statuses], "relay": relay}, indent=2))
        return 0
    rows = [(s.name, "-" if s.lag is None else str(s.lag), s.last_batch, s.quality, s.problem or "ok")
            for s in statuses]
    print(_table(rows, ("pipeline", "lag (offsets)", "last batch", "last quality verdict", "state")))
    parts = [(s.name, f"{x.topic}[{x.partition}]", "-" if x.next_offset is None else str(x.next_offset),
              str(x.lso), str(x.lag)) for s in statuses for x in s.partitions]
    if parts:
        print()
        print(_table(parts, ("pipeline", "partition", "committed (next offset)", "LSO", "lag")))
    shapes = [(s.name, role, str(t.version), f"{t.files:,}", _size(t.mean_file_bytes), _size(t.bytes),
               str(t.oldest_readable_version), s.maintained) for s in statuses for role, t in s.tables.items()]
    if shapes:
        print()
        print(_table(shapes, ("pipeline", "table", "version", "files", "mean file", "bytes", "readable from",
                              "last maintained")))
    if relay is not None:
        print()
        print(_table(list(relay.items()), ("relay", "state")))
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


# -- demo ---------------------------------------------------------------------------


def cmd_acls(args: argparse.Namespace) -> int:
    """The ACLs the relay and the ingest need for this config; with --apply, created."""
    from pathlib import Path

    from connectors.acls import apply, ingest_grants, merged, principal_of, relay_grants
    from connectors.kafka_config import librdkafka_config
    from tidemark.config import KafkaSecurity, load_config
    from tidemark.context import load, preflight, resolve_bootstrap

    # Principals from the config as written: a component's own credentials, else the shared ones,
    # else the embedded cluster's relay and ingest users (not the admin a bare config connects as).
    written = load_config(Path(args.config))
    shared = written.kafka.security if written.kafka.security != KafkaSecurity() else None
    config = load(args.config)
    relay = args.relay_principal or principal_of(written.relay.kafka_security or shared, "relay")
    grants = relay_grants(config, f"User:{relay}")
    for p in written.pipelines:
        user = args.ingest_principal or principal_of(p.kafka_security or shared, "ingest")
        grants += ingest_grants(config, f"User:{user}", only=p.name)
    grants = merged(grants)  # pipelines sharing a principal and topic share one grant
    bootstrap = resolve_bootstrap(config)
    if not args.apply:
        for g in grants:
            print(g.command(bootstrap))
        return 0
    preflight(config, bootstrap)
    apply(librdkafka_config(config.kafka, bootstrap), grants)
    principals = sorted({g.principal for g in grants})
    print(f"created {sum(len(g.operations) for g in grants)} ACL(s) for {', '.join(principals)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from infra.smoke import run_demo

    return run_demo(settings(), keep=args.keep, duration=args.duration)


# -- wiring -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidemark", description="Exactly-once Kafka to Delta Lake ingestion.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show Spark's, librdkafka's, GX's and Prefect's messages here "
                             "(always in TIDEMARK_HOME/logs/)")
    parser.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line, "
                                                                   "INFO and up, on stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    ingest = sub.add_parser("ingest", help="ingest a pipeline's topics into its Delta table, exactly once")
    ingest.add_argument("pipeline")
    ingest.add_argument("--config", default="tidemark.yaml", help="config file (default ./tidemark.yaml)")
    ingest.add_argument("--follow", action="store_true",
                        help="keep ingesting micro-batches; SIGTERM finishes the batch in flight and exits")
    _metrics_arguments(ingest)
    ingest.set_defaults(func=cmd_ingest)

    backfill = sub.add_parser(
        "backfill", help="re-read Kafka into another Delta table, exactly once (re-run to resume)",
        description="Re-read stored batches' exact ranges, or everything from offsets or a time up to now, "
                    "into a new Delta table. Stops with a clear error if retention deleted the records.")
    backfill.add_argument("pipeline")
    backfill.add_argument("--into", required=True, metavar="PATH", help="the Delta table to write (a new path)")
    what = backfill.add_mutually_exclusive_group(required=True)
    what.add_argument("--batches", metavar="FIRST[-LAST]", help="stored batches, e.g. 3-7 (see `offsets show`)")
    what.add_argument("--from-offsets", metavar="SPEC", help="TOPIC:PARTITION=OFFSET,... for every partition")
    what.add_argument("--from-timestamp", metavar="ISO8601", help="e.g. 2026-01-31T00:00:00Z")
    backfill.add_argument("--config", default="tidemark.yaml", help="config file (default ./tidemark.yaml)")
    backfill.set_defaults(func=cmd_backfill)

    maint = sub.add_parser(
        "maintain", help="compact and vacuum a pipeline's tables (safe while ingest runs)",
        description="OPTIMIZE the target, quarantine and ledger (bin-packing; Z-ORDER by "
                    "maintenance.zorder_by), then VACUUM with the table's retention, refused if shorter than "
                    "maintenance.time_travel_hours. Runs beside ingest: compaction never conflicts with its commits.")
    maint.add_argument("pipeline")
    maint.add_argument("--config", default="tidemark.yaml", help="config file (default ./tidemark.yaml)")
    maint.add_argument("--apply-properties", action="store_true",
                       help="also set the maintenance table properties on existing tables (a metadata commit: "
                            "a batch committing at that instant is retried)")
    maint.add_argument("--json", action="store_true", help="machine-readable output")
    maint.set_defaults(func=cmd_maintain)

    offsets = sub.add_parser("offsets", help="stored offsets of a pipeline")
    offsets_sub = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = offsets_sub.add_parser("show", help="per partition: committed offset, LSO, lag; the batch history")
    show.add_argument("pipeline")
    show.add_argument("--config", default="tidemark.yaml")
    show.add_argument("--last", type=int, default=10, help="how many batches of history to show")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_offsets_show)

    check = sub.add_parser("check", help="quality checks of a pipeline's table (Great Expectations); "
                                         "exit 1 if any fails")
    check.add_argument("pipeline")
    check.add_argument("--config", default="tidemark.yaml")
    check.add_argument("--docs", metavar="DIR", help="where the GX project and Data Docs live "
                                                     "(default ~/.tidemark/quality)")
    check.set_defaults(func=cmd_check)

    outbox = sub.add_parser("outbox", help="the application's outbox table")
    outbox_sub = outbox.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = outbox_sub.add_parser("init", help="create the outbox table, its publication and replication slot "
                                              "(idempotent)")
    init.add_argument("--reset-relay", action="store_true",
                      help="recovery (docs/operations.md, 'Relay recovery'): recreate the slot, requeue the outbox "
                           "rows that remain, and start the relay's position there")
    relay = sub.add_parser("relay", help="the outbox relay: committed outbox rows to Kafka, exactly once")
    relay_sub = relay.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = relay_sub.add_parser("run", help="relay until SIGTERM (one source transaction per Kafka transaction)")
    run.add_argument("--idle-exit", type=float, metavar="SECONDS",
                     help="stop after this long without a new transaction (for batch use and tests)")
    run.add_argument("--partitions", type=int, help="partitions of event topics the relay creates "
                                                    "(default relay.topic_partitions, else the cluster's)")
    run.add_argument("--replication-factor", type=int, help="of topics the relay creates "
                                                            "(default relay.replication_factor, else the cluster's)")
    _metrics_arguments(run)
    status = relay_sub.add_parser("status", help="position, slot, lag in events and seconds")
    dead = relay_sub.add_parser("dead-letter", help="acknowledge a refused source transaction: move it whole to "
                                                    "the dead letters, so the relay skips it")
    dead.add_argument("--xid", type=int, required=True, help="the transaction id the relay's error named")
    dead.add_argument("--reason", default="acknowledged by an operator (tidemark relay dead-letter)")
    for p, func in ((init, cmd_outbox_init), (run, cmd_relay_run), (status, cmd_relay_status),
                    (dead, cmd_relay_dead_letter)):
        p.add_argument("--config", default="tidemark.yaml", help="config file (default ./tidemark.yaml if present)")
        p.add_argument("--relay-id", help="overrides relay.id of the config")
        p.set_defaults(func=func)

    serve = sub.add_parser("serve", help="serve the pipelines' Prefect deployments (ingest and audit "
                                         "schedules, backfill) until SIGTERM")
    serve.add_argument("--config", default="tidemark.yaml")
    serve.add_argument("--relay", action="store_true", help="also supervise the outbox relay "
                                                            "(restarted with backoff on crash)")
    serve.add_argument("--no-warm-driver", dest="warm_driver", action="store_false",
                       help="start a Spark driver per run instead of running every run in serve's own warm one")
    _metrics_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    status_p = sub.add_parser("status", help="one screen: each pipeline's offsets, LSO, lag, last batch, "
                                             "last quality verdict; the relay's lag")
    status_p.add_argument("--config", default="tidemark.yaml")
    status_p.add_argument("--no-relay", dest="relay", action="store_false", help="skip the relay's section")
    status_p.add_argument("--json", action="store_true", help="machine-readable output")
    status_p.set_defaults(func=cmd_status)

    acls = sub.add_parser("acls", help="the Kafka ACLs the relay and the ingest need (kafka-acls commands); "
                                       "--apply creates them")
    acls.add_argument("--config", default="tidemark.yaml", help="config file (default ./tidemark.yaml)")
    acls.add_argument("--relay-principal", metavar="NAME",
                      help="the relay's user (default: relay.kafka_security's user or certificate CN, else relay)")
    acls.add_argument("--ingest-principal", metavar="NAME",
                      help="every pipeline's user (default: each pipeline's kafka_security user or certificate "
                           "CN, else ingest)")
    acls.add_argument("--apply", action="store_true", help="create them, connecting as kafka.security says "
                                                             "(a principal allowed to alter ACLs)")
    acls.set_defaults(func=cmd_acls)

    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded stack")
    demo.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    demo.add_argument("--duration", type=float, default=60, metavar="SECONDS",
                      help="how long the sample application writes (default 60)")
    demo.set_defaults(func=cmd_demo)
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


if __name__ == "__main__":
    sys.exit(main())
