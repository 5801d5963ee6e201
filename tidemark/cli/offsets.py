"""`tidemark offsets`: what a pipeline's ledger holds, beside what Kafka holds; and seeks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tidemark.cli.context import CONFIG, pipeline_of
from tidemark.cli.output import table

if TYPE_CHECKING:
    from offsets.ledger import Intent


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    offsets = sub.add_parser("offsets", help="stored offsets of a pipeline")
    offsets_sub = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = offsets_sub.add_parser("show", parents=[CONFIG],
                                  help="per partition: committed offset, LSO, lag; the batch history")
    show.add_argument("pipeline")
    show.add_argument("--last", type=int, default=10, help="how many batches of history to show")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_offsets_show)

    seek = offsets_sub.add_parser(
        "seek", parents=[CONFIG],
        help="move the pipeline to other offsets: a batch of its own, under the pipeline's fence",
        description="Move a pipeline (running or not) to chosen offsets. The seek is claimed in the ledger like a "
                    "batch, so a running `ingest --follow` loses no batch and goes on from the new offsets. Moving "
                    "back needs --reprocess, moving forward --skip; --dry-run prints the plan.")
    seek.add_argument("pipeline")
    to = seek.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", metavar="WHERE", help="earliest, latest, or TOPIC:PARTITION=OFFSET,...")
    to.add_argument("--to-timestamp", metavar="ISO8601", help="the first offset at or after this time, e.g. "
                                                             "2026-01-31T00:00:00Z")
    to.add_argument("--shift-by", type=int, metavar="N", help="N offsets forward (negative: back) from where "
                                                             "each partition is")
    seek.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                      help="only this topic's partitions (repeatable; default: every partition)")
    seek.add_argument("--partition", action="append", default=[], metavar="TOPIC:PARTITION",
                      help="only this partition (repeatable)")
    seek.add_argument("--reprocess", action="store_true", help="allow moving back: records are read again")
    seek.add_argument("--skip", action="store_true", help="allow moving forward: records are passed over "
                                                          "(recorded in the ledger)")
    seek.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    seek.set_defaults(func=cmd_offsets_seek)


def _g3(intent: Intent) -> str:
    """How a batch kept source transactions whole: its write's check, or a scan and what the cut did."""
    if intent.seek is not None:
        return f"seek ({intent.seek.reason})"
    if intent.guarded:
        return "checked in write: none"
    if intent.txns is None and not intent.held and not intent.released:
        return "-"
    seen = "?" if intent.txns is None else str(intent.txns)
    missing = f" ({len(intent.waiting)} missing events)" if intent.waiting else ""
    return f"scanned: {seen}, {intent.held} held{missing}, {len(intent.released)} released"


def cmd_offsets_show(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from connectors.kafka_config import librdkafka_config
    from offsets.lag import partition_lags
    from offsets.ledger import read_ledger
    from offsets.tables import txn_version

    config, pipeline, bootstrap = pipeline_of(args)
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
                         "ranges": [asdict(r) for r in i.ranges if r.span],
                         **({"seek": i.seek.to_dict()} if i.seek else {})} for i in shown]}, indent=2))
        return 0
    rows = [(x.topic, str(x.partition), "-" if x.next_offset is None else str(x.next_offset), str(x.lso), str(x.lag))
            for x in lags]
    print(table(rows, ("topic", "partition", "next offset", "LSO", "lag (offsets)")))
    where = "none yet" if newest is None else f"newest #{newest}"
    print(f"\nbatches ({where} in ledger {pipeline.ledger_path}; last {args.last} shown):")
    history = [(str(i.batch_id), i.planned_at.isoformat(), str(sum(r.span for r in i.ranges)), _g3(i),
                " ".join(f"{m.topic}[{m.partition}]:{'-' if m.old is None else m.old}->{m.new}" for m in i.seek.moves)
                if i.seek else " ".join(f"{r.topic}[{r.partition}]:{r.start}-{r.end}" for r in i.ranges if r.span))
               for i in shown]
    print(table(history, ("batch", "planned at", "offsets", "G3 (multi-event txns)", "ranges")))
    print("\nnote: the newest batch is committed once `tidemark ingest` has run past it (a crash replays it)")
    return 0


def _seek_target(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from pipelines.seek import Target, parse_offsets
    from tidemark.config import TimestampStart
    from tidemark.errors import ConfigError

    if args.to in ("earliest", "latest"):
        return Target(args.to)
    if args.to is not None:
        return Target("offsets", offsets=parse_offsets(args.to))
    if args.to_timestamp is not None:
        try:
            return Target("timestamp", timestamp=TimestampStart(timestamp=args.to_timestamp).timestamp)
        except ValueError:
            raise ConfigError(f"--to-timestamp {args.to_timestamp!r}: give ISO 8601 with a zone, "
                              "e.g. 2026-01-31T00:00:00Z") from None
    return Target("shift", shift=args.shift_by)


def _partitions(specs: list[str]) -> list[tuple[str, int]]:
    from tidemark.errors import ConfigError

    found = []
    for spec in specs:
        topic, _, partition = spec.rpartition(":")
        if not topic or not partition.isdigit():
            raise ConfigError(f"--partition {spec!r}: give TOPIC:PARTITION, e.g. orders:0")
        found.append((topic, int(partition)))
    return found


def cmd_offsets_seek(args: argparse.Namespace) -> int:
    from infra.spark import build_session
    from pipelines.seek import seek
    from tidemark.settings import settings

    target = _seek_target(args)  # the cheap checks before a JVM starts
    partitions = _partitions(args.partition)
    config, pipeline, bootstrap = pipeline_of(args)
    spark = build_session(settings(), f"tidemark-seek-{pipeline.name}")
    try:
        plan = seek(spark, config, pipeline, bootstrap, target, topics=args.topic, partitions=partitions,
                    reprocess=args.reprocess, skip=args.skip, dry_run=args.dry_run)
    finally:
        spark.stop()
    if not plan.moves:
        print(f"{pipeline.name}: every partition in scope is already there; nothing to seek")
        return 0
    verb = "would move" if args.dry_run else "moved"
    print(f"{pipeline.name} {verb} ({target.describe()}), as batch {plan.batch_id}:")
    for line in plan.lines():
        print(f"  {line}")
    if args.dry_run:
        needs = " and ".join(plan.needs())
        print("dry run: nothing written" + (f"; carrying it out needs {needs}" if needs else ""))
    else:
        print(f"the next batch starts there; `tidemark offsets show {pipeline.name}` lists the seek")
    return 0
