"""What G3 (whole source transactions) and dedup cost, side by side on the same relay-written data.

``--records`` events are written by the real relay: an outbox gets source transactions of
1-8 events over 3 aggregate types (3 topics x 3 partitions), committed in PostgreSQL, and
:class:`outbox.relay.Relay` relays them (group commit, with its transaction manifest).
Four pipeline settings then load all of it into fresh tables from one SparkSession, each
``--warmup-rounds`` times untimed (its generated code compiled and warmed; the first
round's times reported as ``first_run_s``), then timed in an order alternating over ``--reps``:

* ``plain``: ``transactions.atomic: false``, no dedup (the rows, offsets and guarantees
  G1/G2/G7 only);
* ``g3``: the default: each batch cut from the relay's manifest, no read of the records
  beyond the write itself, the write checking that nothing unlisted is multi-event;
* ``g3-scan``: ``transactions.scan: always`` and no manifest: a planning scan of every
  batch's headers (what G3 cost before the manifest);
* ``g3+dedup``: the default and ``dedup: {}`` (window lookup in the table, copies within the batch).

Three more, only when named in ``--only``, are not settings a pipeline can have: they take
parts of G3's write away to measure what each costs (``g3`` minus them):

* ``g3-unrecorded``: ``g3`` whose write leaves out the ``_tidemark_txn`` column (the
  guard still checks every record);
* ``g3-cut-only``: ``g3`` whose write leaves out the column and the guard: the manifest's
  cut alone;
* ``g3-narrow``: ``g3`` whose column keeps only ``id`` and ``position``: what a row would
  carry if the fields every event of a transaction shares (``size``, ``expected``,
  ``released``) were recorded once per transaction instead.
* ``g3-flat``: ``g3`` whose column's five fields are written as five top-level columns
  (``_tidemark_txn_id`` ...; the id plainly encoded, as ``_tidemark_txn.id`` is): what
  Parquet's nested group costs.

Each run is checked: every event once, every transaction whole. Reported: medians, the
time ratios to ``plain`` and G3's throughput as a fraction of plain's; ``--json FILE``
writes them (``ratio_g3_vs_plain``: throughput, g3 / plain). ``--batch-records N`` caps every
setting's batches at N records: many small batches in one session, as ``--follow`` takes
them, where a batch's fixed costs (the manifest read among them) weigh most.

    .venv/bin/python -m bench.g3_bench                         # 200,000 events, 2 reps
    .venv/bin/python -m bench.g3_bench --records 20000 --reps 1 --json g3.json
    .venv/bin/python -m bench.g3_bench --records 50000 --batch-records 5000 --reps 1
    .venv/bin/python -m bench.g3_bench --warmup-rounds 4 --reps 3  # a settled JIT, as a long-running driver's
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.relay_bench import postgres

SCHEMA = "order_id STRING, amount DOUBLE, note STRING"
AGGREGATES = ("order", "payment", "shipment")


def settings_for(manifest: str) -> dict[str, dict[str, Any]]:
    return {
        "plain": {"transactions": {"atomic": False}},
        "g3": {"transactions": {"manifest_topic": manifest}},
        "g3-scan": {"transactions": {"scan": "always", "manifest_topic": None}},
        "g3+dedup": {"dedup": {}, "transactions": {"manifest_topic": manifest}},
    }


#: Diagnostic settings (``--only``): ``g3``'s pipeline, its write without these parts.
PARTS_LEFT_OUT = {"g3-unrecorded": ("column",), "g3-cut-only": ("column", "guard"), "g3-narrow": ("shared",),
                  "g3-flat": ("nesting",)}


@contextmanager
def leaving_out(parts: tuple[str, ...]) -> Iterator[None]:
    """The ingest's batches built without ``parts`` of G3's write (``column``, ``guard``, ``shared``, ``nesting``)."""
    from pyspark.sql import functions as F

    from pipelines import ingest
    from pipelines.transactions.headers import TXN_COLUMN
    from quality.audit import TXN_FIELDS

    if not parts:
        yield
        return
    built = ingest.frames

    def frames(*args: Any, **kwargs: Any) -> Any:
        f = built(*args, **kwargs)
        if "guard" in parts:
            f = replace(f, guard=None)
        if "column" in parts:
            good = f.good
            f = replace(f, good=lambda df: good(df).drop(TXN_COLUMN))
        elif "shared" in parts:
            good = f.good
            f = replace(f, good=lambda df: good(df).withColumn(
                TXN_COLUMN, F.col(TXN_COLUMN).dropFields("size", "expected", "released")))
        elif "nesting" in parts:
            good = f.good
            f = replace(f, good=lambda df: good(df).withColumns(
                {f"{TXN_COLUMN}_{n}": F.col(TXN_COLUMN)[n] for n in TXN_FIELDS}).drop(TXN_COLUMN))
        return f

    ingest.frames = frames
    if "nesting" in parts:  # as infra.spark.PLAIN_ENCODED_COLUMNS has it for the nested id
        from pyspark.sql import SparkSession

        hadoop = SparkSession.getActiveSession().sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        hadoop.set(f"parquet.enable.dictionary#{TXN_COLUMN}_id", "false")
    try:
        yield
    finally:
        ingest.frames = built


def relay_written(bootstrap: str, dsn: str, records: int, *, value_bytes: int, seed: int) -> tuple[list[str], str, int]:
    """``records`` events in source transactions of 1-8, relayed by the real relay; (topics, manifest topic, txns)."""
    import psycopg2
    from psycopg2.extras import execute_values

    from outbox.relay import Relay
    from outbox.schema import TableName, init_outbox
    from tidemark.config import RelayConfig

    run = uuid.uuid4().hex[:6]
    relay = RelayConfig(id=f"g3bench-{run}", table=f"public.outbox_{run}", topic=f"bench-g3-{run}-{{aggregatetype}}",
                        offsets_topic=f"bench-g3-{run}.offsets", manifest_topic=f"bench-g3-{run}.manifest",
                        topic_partitions=3)
    table = TableName.parse(relay.table)
    init_outbox(dsn, table=table, publication=relay.publication_name, slot=relay.slot_name)
    rng = random.Random(seed)
    written = txns = 0
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            while written < records:
                rows = []
                for _ in range(min(rng.randint(1, 8), records - written)):
                    body = {"order_id": f"o-{written}", "amount": round(rng.uniform(1, 500), 2), "note": ""}
                    body["note"] = "x" * max(0, value_bytes - len(json.dumps(body)))
                    rows.append((str(uuid.uuid4()), rng.choice(AGGREGATES), f"k{rng.randrange(100)}", "Changed",
                                 json.dumps(body)))
                    written += 1
                execute_values(cur, f"INSERT INTO {table.sql} (id, aggregatetype, aggregateid, type, payload) "
                               "VALUES %s", rows, template="(%s, %s, %s, %s, %s::jsonb)")
                conn.commit()
                txns += 1
    finally:
        conn.close()
    job = Relay(relay, dsn=dsn, client_config={"bootstrap.servers": bootstrap})
    job.run(threading.Event(), idle_exit=3)
    if job.report.events != records:
        raise AssertionError(f"the relay relayed {job.report.events} of {records} events")
    return [relay.topic_for(a) for a in AGGREGATES], relay.manifest_topic, txns


def run(spark: Any, bootstrap: str, topics: list[str], target: Path, settings: dict[str, Any],
        parts: tuple[str, ...] = ()) -> tuple[int, int]:
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "bench", "topics": topics, "target": str(target), "schema": SCHEMA, **settings}]})
    with leaving_out(parts):
        report = IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
    return report.rows, len(report.batches)


def verify(spark: Any, target: Path, expected: int) -> None:
    df = spark.read.format("delta").load(str(target))
    n, ids = df.selectExpr("count(*)", "count(DISTINCT _tidemark_event_id)").first()  # type: ignore[misc]
    if not n == ids == expected:
        raise AssertionError(f"{target.name}: {n} rows, {ids} distinct event ids; expected {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="untimed runs of every setting before the timed ones, alternating order (the first "
                             "round's times are reported as first_run_s): more rounds measure a JVM whose JIT "
                             "compilers have settled, as a long-running `serve` driver's have")
    parser.add_argument("--batch-records", type=int,
                        help="max_records_per_batch of every setting: many small batches in one run, as "
                             "`--follow` takes them (default: the pipeline's, one batch)")
    parser.add_argument("--only", type=lambda v: [n.strip() for n in v.split(",") if n.strip()],
                        help="a comma-separated subset of the settings to run, plain and g3 always among them "
                             "(e.g. `plain,g3`: more paired runs in the same time)")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--dsn", help="use this PostgreSQL instead of a fresh embedded server")
    report_arguments(parser)
    args = parser.parse_args(argv)
    chosen = [*settings_for(""), *PARTS_LEFT_OUT]
    if args.only is not None:
        unknown = sorted(set(args.only) - set(chosen))
        if unknown or not {"plain", "g3"} <= set(args.only):
            parser.error(f"--only takes settings among {', '.join(chosen)}, plain and g3 included; got {args.only}")

    from infra.spark import build_session
    from tidemark.settings import load_settings

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-g3-bench-"))
    times: dict[str, list[float]] = {}
    batches: dict[str, list[int]] = {}
    first: dict[str, float] = {}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _), postgres(args.dsn) as dsn:
            t0 = time.perf_counter()
            topics, manifest, txns = relay_written(bootstrap, dsn, args.records, value_bytes=args.value_bytes,
                                                   seed=7)
            print(f"relayed {args.records:,} events in {txns:,} source transactions "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
            pipelines = settings_for(manifest)
            available = {**pipelines, **{name: pipelines["g3"] for name in PARTS_LEFT_OUT}}
            settings = {name: s for name, s in available.items()
                        if (name in args.only if args.only is not None else name not in PARTS_LEFT_OUT)}
            if args.batch_records:
                settings = {name: {**s, "max_records_per_batch": args.batch_records} for name, s in settings.items()}
            spark = build_session(load_settings(), "tidemark-g3-bench", warehouse=work / "warehouse")
            try:
                # Every setting once before any is timed: each compiles its own generated code, and
                # HotSpot takes two runs of a 200k batch to compile it (a session's first G3 run
                # took about 2 s longer than its third); warming plain alone charged that to the
                # G3 settings' medians. Their times are reported
                # apart (`first_run_s`): what a fresh process pays once.
                for round_ in range(max(1, args.warmup_rounds)):
                    for name in settings if round_ % 2 == 0 else reversed(settings):
                        # A fresh target each round: the same path again would find its ledger
                        # (beside the target) and replay batch 1 instead of planning it.
                        target = work / f"warmup-{round_}-{name}"
                        t0 = time.perf_counter()
                        run(spark, bootstrap, topics, target, settings[name], PARTS_LEFT_OUT.get(name, ()))
                        elapsed = time.perf_counter() - t0
                        first.setdefault(name, elapsed)
                        print(f"warm-up {round_ + 1} {name}: {elapsed:.1f}s", flush=True)
                        shutil.rmtree(target, ignore_errors=True)
                for rep in range(args.reps):
                    order = list(settings) if rep % 2 == 0 else list(reversed(settings))
                    for name in order:
                        target = work / f"{name}-{rep}"
                        t0 = time.perf_counter()
                        rows, n = run(spark, bootstrap, topics, target, settings[name], PARTS_LEFT_OUT.get(name, ()))
                        elapsed = time.perf_counter() - t0
                        verify(spark, target, args.records)
                        times.setdefault(name, []).append(elapsed)
                        batches.setdefault(name, []).append(n)
                        print(f"rep {rep + 1} {name}: {elapsed:.1f}s, {rows:,} rows, {n} batch(es)", flush=True)
                        shutil.rmtree(target, ignore_errors=True)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(t) for name, t in times.items()}
    # plain and g3 run next to each other in every rep (the order alternates), so each rep's
    # ratio compares runs under the same moment's load: steadier than a ratio of medians.
    paired = [p / g for p, g in zip(times["plain"], times["g3"], strict=True)]
    paired_each = {name: statistics.median(p / t for p, t in zip(times["plain"], runs, strict=True))
                   for name, runs in times.items()}
    lines = ["", *header("G3 and dedup cost (relay-written topics, with the manifest)", load_before),
             (f"Data: {args.records:,} events of ~{args.value_bytes} B in {txns:,} source transactions of 1-8 events "
              "over 3 topics x 3 partitions, relayed by the relay; each run into a fresh table, verified."), "",
             ("| setting | median s | events/s | batches | all runs (s) | time vs plain | throughput vs plain "
              "| throughput vs plain, median of the reps' pairs |"),
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name, runs in times.items():
        lines.append(f"| {name} | {med[name]:.1f} | {args.records / med[name]:,.0f} | "
                     f"{statistics.median(batches[name]):.0f} | {', '.join(f'{t:.1f}' for t in runs)} | "
                     f"{med[name] / med['plain']:.2f}× | {med['plain'] / med[name]:.2f}× | "
                     f"{paired_each[name]:.2f}× |")
    lines += ["", (f"g3 throughput / plain, per rep (runs side by side): {', '.join(f'{r:.2f}' for r in paired)}; "
                   f"median **{statistics.median(paired):.2f}×**.")]
    lines += ["", f"Each setting ran {max(1, args.warmup_rounds)} time(s) before the timed runs (its code compiled "
              "and JIT-warmed); the first: "
              + ", ".join(f"{name} {t:.1f} s" for name, t in first.items())
              + " (plain's first also starts the session's Kafka source and Delta)."]
    emit(lines, args.output)
    emit_json({"benchmark": "g3_bench", "records": args.records, "reps": args.reps, "batch_records": args.batch_records,
               "warmup_rounds": max(1, args.warmup_rounds),
               "seconds": med, "runs_s": times, "first_run_s": first,
               "ratio_g3_vs_plain": med["plain"] / med["g3"],
               "ratio_g3_vs_plain_paired": paired, "ratio_g3_vs_plain_paired_median": statistics.median(paired),
               "ratio_g3_scan_vs_plain": med["plain"] / med["g3-scan"] if "g3-scan" in med else None,
               "ratio_g3_dedup_vs_plain": med["plain"] / med["g3+dedup"] if "g3+dedup" in med else None,
               "ratio_vs_plain_paired_median": paired_each},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
