"""Tidemark's ingest vs Spark Structured Streaming's own Kafka→Delta, side by side in one run.

A throwaway broker gets ``--records`` JSON values of about 1 KB over 8 partitions from a
transactional producer. Both contenders then load the whole topic into a fresh Delta
table from the same SparkSession (same Spark settings, same Kafka client options,
read_committed), with the same parse (``from_json`` against the same schema) and the
same lineage columns:

* ``tidemark``: ``IngestJob.run_bounded()`` — intent ledger, exact ranges, one Delta
  commit per batch carrying rows and offsets, quarantine settled; every guarantee on.
* ``structured-streaming``: ``readStream.format("kafka")`` → ``writeStream.format("delta")``
  with ``Trigger.AvailableNow`` and a checkpoint directory.

Two more contenders on the same data in the same session measure the machine's limit:

* ``read-only``: the whole topic through Spark's Kafka source with Tidemark's fetch
  settings and headers, counted: no parse, no write;
* ``write-only``: the same rows Tidemark wrote (its untimed warm-up's table, read back
  from Parquet) appended to a fresh Delta table.

The limit is the slower of the two (what ingest would take if reading and writing
overlapped perfectly). Each run also reports how many of the machine's cores were busy
(``/proc/stat``, the broker's work included), and the report gives the sum of read-only
and write-only: where each keeps nearly every core busy, the two can hardly overlap, and
the sum is a rough estimate of an ingest with a free parse and free bookkeeping (rough:
write-only also reads its Parquet, and both pay a job's set-up). The order rotates over
``--reps``. Each run is checked: the table holds exactly the committed records, once.
Reported: records/s and cores busy per run, medians, the ratios to Structured Streaming,
to the limit and to the sum. Then ``--process-runs`` runs of ``tidemark ingest`` as a whole
cold process (its own JVM), and as many processes that only start and stop a session, so
the difference to the in-process figure is split into session start-up and the rest;
with each process tree's peak resident memory.

    .venv/bin/python -m bench.ingest_bench --reps 3 --json docs/bench/ingest.json   # 1,000,000 records
    .venv/bin/python -m bench.ingest_bench --records 50000 --reps 1
    .venv/bin/python -m bench.ingest_bench --reps 5 --warmup-rounds 2 --process-runs 0 --peer-read-tuning  # settled JIT
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import busy_cpu_seconds, emit, emit_json, header, kafka_broker, loadavg, report_arguments

PARTITIONS = 8
SCHEMA = "order_id STRING, customer STRING, amount DOUBLE, currency STRING, items ARRAY<STRING>, note STRING"


def new_topic(bootstrap: str, prefix: str) -> str:
    """A fresh topic of :data:`PARTITIONS` partitions named ``<prefix>-<random>``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


def produce(bootstrap: str, topic: str, records: int, *, value_bytes: int, txn_size: int, seed: int) -> int:
    """Write ``records`` committed JSON records in transactions; returns the bytes of values."""
    from confluent_kafka import Producer

    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.kbytes": 1_048_576})
    producer.init_transactions(30)
    total = 0
    written = 0
    while written < records:
        producer.begin_transaction()
        for _ in range(min(txn_size, records - written)):
            customer = f"c-{rng.randrange(10_000)}"
            base = {"order_id": f"o-{written}", "customer": customer,
                    "amount": round(rng.uniform(1, 500), 2), "currency": "EUR",
                    "items": [f"sku-{rng.randrange(1000)}" for _ in range(3)]}
            pad = value_bytes - len(json.dumps({**base, "note": ""}))
            value = json.dumps({**base, "note": "x" * max(0, pad)}).encode()
            total += len(value)
            producer.produce(topic, value=value, key=customer.encode(), partition=written % PARTITIONS)
            written += 1
            if written % 10_000 == 0:
                producer.poll(0)
        producer.commit_transaction(60)
    producer.flush(60)
    return total


#: Extra pipeline settings for Tidemark's runs (``--tidemark-cap``); empty means its defaults.
TIDEMARK_OPTIONS: dict[str, Any] = {}


def run_tidemark(spark: Any, bootstrap: str, topic: str, target: Path) -> tuple[int, int]:
    """(rows, batches) written by Tidemark's bounded ingest."""
    from pipelines.ingest import IngestJob
    from tidemark.config import parse_config

    config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
        {"name": "bench", "topics": [topic], "target": str(target), "schema": SCHEMA, **TIDEMARK_OPTIONS}]})
    report = IngestJob(spark, config, config.pipelines[0], bootstrap).run_bounded()
    return report.rows, len(report.batches)


#: Extra Kafka options for the peer's read (``--peer-read-tuning``: Tidemark's fetch settings); empty: Spark's.
PEER_KAFKA_OPTIONS: dict[str, str] = {}


def run_structured_streaming(spark: Any, bootstrap: str, topic: str, target: Path | str,
                             checkpoint: Path | None = None) -> tuple[int, int]:
    """(rows, micro-batches) written by readStream kafka → writeStream delta, AvailableNow
    (its checkpoint beside the table unless ``checkpoint`` says where)."""
    from pyspark.sql import functions as F

    from connectors.kafka_config import spark_options
    from tidemark.config import KafkaConnection

    options = {**PEER_KAFKA_OPTIONS, **spark_options(KafkaConnection(bootstrap_servers=bootstrap), bootstrap)}
    raw = (spark.readStream.format("kafka").options(**options).option("subscribe", topic)
           .option("startingOffsets", "earliest").option("failOnDataLoss", "true").load())
    parsed = raw.withColumn("_parsed", F.from_json(F.col("value").cast("string"), SCHEMA))
    rows = parsed.select("_parsed.*", F.col("topic").alias("_kafka_topic"),
                         F.col("partition").alias("_kafka_partition"), F.col("offset").alias("_kafka_offset"),
                         F.col("timestamp").alias("_kafka_timestamp"), F.col("key").alias("_kafka_key"))
    query = (rows.writeStream.format("delta").option("checkpointLocation", str(checkpoint or f"{target}_checkpoint"))
             .trigger(availableNow=True).start(str(target)))
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"structured streaming failed: {query.exception()}")
    batches = len(query.recentProgress)
    count = spark.read.format("delta").load(str(target)).count()
    return count, batches


def run_read_only(spark: Any, bootstrap: str, topic: str, target: Path) -> tuple[int, int]:
    """(records, 1): the whole topic read as Tidemark reads a batch's ranges, and counted."""
    from connectors.kafka_config import spark_options
    from pipelines.transform import BULK_READ_OPTIONS
    from tidemark.config import KafkaConnection

    options = {**BULK_READ_OPTIONS, **spark_options(KafkaConnection(bootstrap_servers=bootstrap), bootstrap)}
    count = (spark.read.format("kafka").options(**options).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("endingOffsets", "latest")
             .option("includeHeaders", "true").option("failOnDataLoss", "true").load().count())
    return count, 1


#: The rows ``write-only`` appends: Tidemark's warm-up table (set once the warm-up ran).
WRITE_SOURCE: list[Path] = []


def run_write_only(spark: Any, bootstrap: str, topic: str, target: Path) -> tuple[int, int]:
    """(rows, 1): Tidemark's rows, read back from Parquet, appended to a fresh Delta table."""
    spark.read.format("delta").load(str(WRITE_SOURCE[0])).write.format("delta").mode("append").save(str(target))
    return spark.read.format("delta").load(str(target)).count(), 1


def process_run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, int]:
    """(seconds, peak resident bytes of the process tree's largest process) of one command."""
    import subprocess

    import psutil

    output = cwd / f"process-{uuid.uuid4().hex[:8]}.log"  # a file, not a pipe nobody drains while it runs
    started = time.perf_counter()
    with output.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            for p in [root, *root.children(recursive=True)]:
                peak = max(peak, p.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.1)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        out = output.read_text(errors="replace")
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{out[-3000:]}")
    return elapsed, peak


SESSION_ONLY = ("from infra.spark import build_session; from tidemark.settings import load_settings; "
                "build_session(load_settings(), 'tidemark-session-only').stop()")


def whole_process(bootstrap: str, topic: str, work: Path, runs: int, expected: int) -> dict[str, list[float]]:
    """``tidemark ingest`` as a cold process (config file, own JVM) vs a process that only starts a session."""
    import yaml

    tidemark = Path(sys.executable).with_name("tidemark")
    out: dict[str, list[float]] = {"process": [], "session_only": [], "process_peak_rss": [],
                                   "session_only_peak_rss": []}
    for run in range(runs):
        target = work / f"process-{run}"
        config = work / f"process-{run}.yaml"
        config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
            {"name": "bench", "topics": [topic], "target": str(target), "schema": SCHEMA, **TIDEMARK_OPTIONS}]}))
        seconds, peak = process_run([str(tidemark), "ingest", "bench", "--config", str(config)], work)
        out["process"].append(seconds)
        out["process_peak_rss"].append(peak)
        count = _delta_rows(target)
        if count != expected:
            raise AssertionError(f"tidemark ingest as a process wrote {count} rows, expected {expected}")
        seconds, peak = process_run([sys.executable, "-c", SESSION_ONLY], work)
        out["session_only"].append(seconds)
        out["session_only_peak_rss"].append(peak)
        print(f"process run {run + 1}: ingest {out['process'][-1]:.1f}s (peak {out['process_peak_rss'][-1] / 2**30:.2f}"
              f" GiB), session start+stop {seconds:.1f}s", flush=True)
        shutil.rmtree(target, ignore_errors=True)
    return out


def process_lines(process: dict[str, list[float]], pmed: dict[str, float], in_process: float,
                  runs: int) -> list[str]:
    """The report's whole-process table: where a cold ``tidemark ingest`` spends the time the warm one does not."""
    return ["", f"Whole process, cold (medians of {runs}):", "",
            "| process | median s | all runs (s) | peak RSS of its largest process |", "|---|---:|---|---:|",
            (f"| `tidemark ingest bench` | {pmed['process']:.1f} | "
             f"{', '.join(f'{t:.1f}' for t in process['process'])} | {pmed['process_peak_rss'] / 2**30:.2f} GiB |"),
            (f"| session start + stop only | {pmed['session_only']:.1f} | "
             f"{', '.join(f'{t:.1f}' for t in process['session_only'])} | "
             f"{pmed['session_only_peak_rss'] / 2**30:.2f} GiB |"), "",
            (f"Of the process's {pmed['process']:.1f} s: {pmed['session_only']:.1f} s Python imports, JVM, jars and "
             f"session; {in_process:.1f} s the ingest as measured in process (warm session); "
             f"{pmed['process'] - pmed['session_only'] - in_process:.1f} s the rest (first Delta snapshot and "
             f"Kafka metadata on a cold JVM, class loading, JIT warm-up).")]


def _delta_rows(path: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_dataset().count_rows()


def verify(spark: Any, target: Path | str, expected: int) -> None:
    """Exactly the committed records, each once: count and distinct (partition, offset) agree."""
    df = spark.read.format("delta").load(str(target))
    stats = df.selectExpr("count(*) AS n", "count(DISTINCT _kafka_partition, _kafka_offset) AS d",
                          "count(order_id) AS parsed").first()
    if not (stats.n == stats.d == stats.parsed == expected):
        raise AssertionError(f"{target}: {stats.n} rows, {stats.d} distinct offsets, {stats.parsed} parsed; "
                             f"expected {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--txn-size", type=int, default=1000, help="records per producer transaction")
    parser.add_argument("--reps", type=int, default=2, help="runs per contender, order alternating")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--tidemark-cap", type=int, help="Tidemark's max_records_per_batch (default: its default)")
    parser.add_argument("--g3", choices=("on", "off"), default="on",
                        help="Tidemark's transactions.atomic (off: no planning scan; these records have no "
                             "multi-event source transactions, so G3 holds either way)")
    parser.add_argument("--peer-read-tuning", action="store_true",
                        help="give Structured Streaming Tidemark's Kafka fetch settings "
                             "(pipelines.transform.BULK_READ_OPTIONS) as well")
    parser.add_argument("--warmup-rounds", type=int, default=0,
                        help="untimed runs of every contender before the timed reps (Tidemark also has its "
                             "own first warm-up): each contender's code compiled and warmed, not only Tidemark's")
    parser.add_argument("--process-runs", type=int, default=2,
                        help="cold `tidemark ingest` processes (and session-only processes) timed after the reps")
    report_arguments(parser)
    args = parser.parse_args(argv)
    if args.peer_read_tuning:
        from pipelines.transform import BULK_READ_OPTIONS

        PEER_KAFKA_OPTIONS.update(BULK_READ_OPTIONS)
    if args.tidemark_cap:
        TIDEMARK_OPTIONS["max_records_per_batch"] = args.tidemark_cap
    if args.g3 == "off":
        TIDEMARK_OPTIONS["transactions"] = {"atomic": False}

    from infra.spark import build_session, versions
    from tidemark.settings import load_settings

    load_before = loadavg()
    settings = load_settings()
    work = Path(tempfile.mkdtemp(prefix="tidemark-ingest-bench-"))
    contenders = {"tidemark": run_tidemark, "structured-streaming": run_structured_streaming,
                  "read-only": run_read_only, "write-only": run_write_only}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    batches: dict[str, list[int]] = {name: [] for name in contenders}
    cores: dict[str, list[float]] = {name: [] for name in contenders}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
            topic = new_topic(bootstrap, "bench-ingest")
            started = time.perf_counter()
            value_bytes = produce(bootstrap, topic, args.records, value_bytes=args.value_bytes,
                                  txn_size=args.txn_size, seed=7)
            print(f"produced {args.records:,} records ({value_bytes / 1e6:.0f} MB) in "
                  f"{time.perf_counter() - started:.0f}s", flush=True)
            spark = build_session(settings, "tidemark-ingest-bench", warehouse=work / "warehouse")
            try:
                # Warm-up, untimed: JVM, Kafka client classes and the broker's page cache.
                run_tidemark(spark, bootstrap, topic, work / "warmup")
                WRITE_SOURCE.append(work / "warmup")
                for warm_round in range(args.warmup_rounds):
                    for name, contender in contenders.items():
                        target = work / f"warm-{name}-{warm_round}"
                        rows, _ = contender(spark, bootstrap, topic, target)
                        if rows != args.records:
                            raise AssertionError(f"{name} (warm-up): {rows} rows, expected {args.records}")
                        shutil.rmtree(target, ignore_errors=True)
                        shutil.rmtree(str(target) + "_checkpoint", ignore_errors=True)
                names = list(contenders)
                for rep in range(args.reps):
                    order = names[rep % len(names):] + names[:rep % len(names)]
                    order = order if rep % 2 == 0 else list(reversed(order))
                    for name in order:
                        target = work / f"{name}-{rep}"
                        busy, t0 = busy_cpu_seconds(), time.perf_counter()
                        rows, n_batches = contenders[name](spark, bootstrap, topic, target)
                        elapsed = time.perf_counter() - t0
                        busy_after = busy_cpu_seconds()
                        core = None if busy is None or busy_after is None else (busy_after - busy) / elapsed
                        if core is not None:
                            cores[name].append(core)
                        if rows != args.records:
                            raise AssertionError(f"{name}: {rows} rows, expected {args.records}")
                        if name != "read-only":
                            verify(spark, target, args.records)
                        times[name].append(elapsed)
                        batches[name].append(n_batches)
                        print(f"rep {rep + 1} {name}: {elapsed:.1f}s, {args.records / elapsed:,.0f} records/s, "
                              f"{n_batches} batch(es), {'?' if core is None else f'{core:.2f}'} cores busy",
                              flush=True)
                        shutil.rmtree(target, ignore_errors=True)
                        shutil.rmtree(str(target) + "_checkpoint", ignore_errors=True)
                vers = versions(settings)
            finally:
                spark.stop()
            process = whole_process(bootstrap, topic, work, args.process_runs, args.records)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(t) for name, t in times.items()}
    lines = [
        "",
        *header("Ingest throughput: Tidemark vs Structured Streaming AvailableNow", load_before),
        (f"Versions: pyspark {vers['pyspark']}, delta-spark {vers['delta-spark (jar)']}, Kafka {broker_version}; "
        f"master {settings.spark.master}, {settings.spark.shuffle_partitions} shuffle partitions, "
        f"driver memory {settings.spark.driver_memory}.  "),
        (f"Data: {args.records:,} JSON records of ~{args.value_bytes} B ({value_bytes / 1e6:.0f} MB) in "
        f"{PARTITIONS} partitions, transactions of {args.txn_size}; both parse with `from_json` into "
        f"`{SCHEMA}` plus lineage columns; each run into a fresh table, verified exactly-once. "
        f"Tidemark pipeline options: {TIDEMARK_OPTIONS or 'defaults'}; peer's extra Kafka options: "
        f"{PEER_KAFKA_OPTIONS or 'none'}. Untimed runs before the reps: Tidemark 1, then every contender "
        f"{args.warmup_rounds}."),
        "",
        "| contender | median s | records/s | batches | cores busy (median) | all runs (s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    busy_med = {name: statistics.median(c) for name, c in cores.items() if c}
    for name in contenders:
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        busy_text = f"{busy_med[name]:.2f}" if name in busy_med else "?"
        lines.append(f"| {name} | {med[name]:.1f} | {args.records / med[name]:,.0f} | "
                     f"{statistics.median(batches[name]):.0f} | {busy_text} | {runs} |")
    ratio = med["structured-streaming"] / med["tidemark"]
    limit = max(med["read-only"], med["write-only"])
    ratio_limit = limit / med["tidemark"]
    serial = med["read-only"] + med["write-only"]  # read, then write: little overlap where each fills the cores
    lines += ["", f"**Tidemark throughput / Structured Streaming throughput = {ratio:.2f}×** (median times).",
              (f"**Tidemark / the limit (the slower of read-only and write-only, {limit:.1f} s) = "
               f"{ratio_limit:.2f}×**; vs read-only {med['read-only'] / med['tidemark']:.2f}×, vs write-only "
               f"{med['write-only'] / med['tidemark']:.2f}×."),
              # Reading and writing overlap little where each keeps nearly every core busy on its own.
              (f"Read-only and write-only together take {serial:.1f} s (cores busy: "
               f"{busy_med.get('read-only', float('nan')):.2f} and {busy_med.get('write-only', float('nan')):.2f} "
               f"of {os.cpu_count()}). Where both keep nearly every core busy, the two can hardly overlap, and "
               "the sum roughly estimates an ingest whose parse and bookkeeping cost nothing (roughly: "
               "write-only also reads its Parquet, and both pay a job's set-up). Against the sum such an "
               f"ingest would reach {limit / serial:.2f}× the limit and {med['structured-streaming'] / serial:.2f}× "
               f"Structured Streaming; Tidemark reaches {serial / med['tidemark']:.2f}× the sum.")]
    pmed = {k: statistics.median(v) for k, v in process.items() if v}  # empty with --process-runs 0
    if pmed:
        lines += process_lines(process, pmed, med["tidemark"], args.process_runs)
    emit(lines, args.output)
    emit_json({"benchmark": "ingest_bench", "records": args.records, "value_bytes": args.value_bytes,
               "txn_size": args.txn_size, "reps": args.reps, "warmup_rounds": args.warmup_rounds, "g3": args.g3,
               "peer_read_tuning": args.peer_read_tuning, "seconds": times, "median_seconds": med,
               "ratio_vs_structured_streaming": ratio, "ratio_vs_limit": ratio_limit,
               "ratio_vs_read_only": med["read-only"] / med["tidemark"],
               "ratio_vs_write_only": med["write-only"] / med["tidemark"],
               "cores_busy": cores, "cores_busy_median": busy_med, "read_plus_write_s": serial,
               "ratio_vs_read_plus_write": serial / med["tidemark"], "limit_over_read_plus_write": limit / serial,
               "structured_streaming_over_read_plus_write": med["structured-streaming"] / serial,
               "whole_process_seconds": pmed.get("process"), "session_only_seconds": pmed.get("session_only"),
               "process_runs": process, "peak_rss_bytes": pmed.get("process_peak_rss")}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
