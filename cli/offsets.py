"""`tidemark offsets`: what a pipeline's ledger holds, beside what Kafka holds."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.context import pipeline_of
from cli.output import table

if TYPE_CHECKING:
    from offsets.ledger import Intent


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this group's commands to the ``tidemark`` parser."""
    offsets = sub.add_parser("offsets", help="stored offsets of a pipeline")
    offsets_sub = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = offsets_sub.add_parser("show", help="per partition: committed offset, LSO, lag; the batch history")
    show.add_argument("pipeline")
    show.add_argument("--config", default="tidemark.yaml")
    show.add_argument("--last", type=int, default=10, help="how many batches of history to show")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_offsets_show)


def _g3(intent: Intent) -> str:
    """How a batch kept source transactions whole: its write's check, or a scan and what the cut did."""
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
                         "ranges": [asdict(r) for r in i.ranges if r.span]} for i in shown]}, indent=2))
        return 0
    rows = [(x.topic, str(x.partition), "-" if x.next_offset is None else str(x.next_offset), str(x.lso), str(x.lag))
            for x in lags]
    print(table(rows, ("topic", "partition", "next offset", "LSO", "lag (offsets)")))
    where = "none yet" if newest is None else f"newest #{newest}"
    print(f"\nbatches ({where} in ledger {pipeline.ledger_path}; last {args.last} shown):")
    history = [(str(i.batch_id), i.planned_at.isoformat(), str(sum(r.span for r in i.ranges)),
                _g3(i), " ".join(f"{r.topic}[{r.partition}]:{r.start}-{r.end}" for r in i.ranges if r.span))
               for i in shown]
    print(table(history, ("batch", "planned at", "offsets", "G3 (multi-event txns)", "ranges")))
    print("\nnote: the newest batch is committed once `tidemark ingest` has run past it (a crash replays it)")
    return 0
