"""Exact-range reader benchmark: Spark's ``kafka`` source (V2 and V1) vs the confluent-kafka Python Data Source.

Starts a throwaway embedded Kafka broker on free ports and a Tidemark SparkSession, writes a
transactional topic (8 partitions, ~20 % aborted transactions, ~1 KB JSON values, headers on
every 10th record) plus a topic whose ranges hold only aborted records and markers, then in
one run, alternating the order over ``--reps`` repetitions, reads the exact ranges
``[0, LSO)`` with

* ``spark``: ``pipelines.transform.read_ranges`` (Spark's ``kafka`` source, read_committed),
  as Tidemark's sessions read it: through the source's DataSource V2 scan
  (``infra.spark.V1_SOURCES``);
* ``spark-v1``: the same call with ``kafka`` back in ``spark.sql.sources.useV1SourceList``
  (Spark's default for batch reads, and Tidemark's read before the V2 scan): the source's V1
  relation, whose records Spark converts to external ``Row`` objects and back;
* ``pyds``:  ``bench.diagnostics.pyds_kafka`` (PySpark Python Data Source on confluent-kafka);

each followed by ``count(*), sum(length(value))`` so every byte is read. Before timing, an
untimed pass checks every reader returns exactly the committed records (topic, partition,
offset from the producer's delivery reports, and a hash of key/value/timestamp/headers),
the same content as the first reader's. Prints a markdown table (median seconds, the driver JVM's
CPU seconds, records/s, time ratio vs ``spark``); ``--json FILE`` writes the figures
(``ratio_v1_vs_v2_time``: the median of the paired time ratios spark-v1 / spark).

    .venv/bin/python -m bench.diagnostics.reader_bench                 # N=200,000, 3 reps
    .venv/bin/python -m bench.diagnostics.reader_bench --records 20000 --reps 2
    .venv/bin/python -m bench.diagnostics.reader_bench --records 1000000 --only spark,spark-v1 --reps 8 --json read.json

pyarrow is needed by any Python Data Source; the ``dev`` extra (``make bootstrap``)
installs it. ``--pydeps DIR`` adds another directory to the workers' path.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, loadavg

REPO = Path(__file__).resolve().parent.parent
TOPIC_PARTITIONS = 8
READERS = ("spark", "spark-v1", "pyds")


def _prepare_python_path(pydeps: str | None) -> None:
    """Make the repo (for ``bench.diagnostics.pyds_kafka``) and pyarrow importable here and in Spark's workers."""
    extra = [str(REPO)] + ([str(Path(pydeps).resolve())] if pydeps else [])
    for p in reversed(extra):
        if p not in sys.path:
            sys.path.insert(0, p)
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(extra + ([old] if old else []))
    # Workers must run this interpreter (the venv's), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        sys.exit("pyarrow is not importable: run `make bootstrap` (the dev extra installs it)")


# -- data ---------------------------------------------------------------------------


class Produced:
    """Offsets of every record the producer wrote, by transaction outcome."""

    def __init__(self) -> None:
        self.committed: set[tuple[str, int, int]] = set()
        self.aborted: set[tuple[str, int, int]] = set()
        self.value_bytes = 0
        self.transactions = {"committed": 0, "aborted": 0}


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "compression.type": "none",
    })
    producer.init_transactions(30)
    return producer


def _write_transaction(producer: Any, topic: str, records: list[tuple[int, bytes, bytes, Any]],
                       commit: bool, produced: Produced) -> None:
    from confluent_kafka import KafkaException

    pending: list[tuple[str, int, int]] = []
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            pending.append((msg.topic(), msg.partition(), msg.offset()))

    producer.begin_transaction()
    for partition, key, value, headers in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    if errors:
        raise KafkaException(errors[0])
    if commit:
        producer.commit_transaction(60)
        produced.committed.update(pending)
        produced.value_bytes += sum(len(r[2]) for r in records)
        produced.transactions["committed"] += 1
    else:
        producer.abort_transaction(60)
        produced.aborted.update(pending)
        produced.transactions["aborted"] += 1


def write_main_topic(bootstrap: str, topic: str, n: int, *, value_bytes: int, txn_size: int,
                     abort_rate: float, seed: int) -> Produced:
    """``n`` records in transactions of ``txn_size`` spread over all partitions; ~abort_rate abort."""
    rng = random.Random(seed)
    pad = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(2 * value_bytes + 64))
    produced = Produced()
    producer = _producer(bootstrap)
    i = 0
    txn = 0
    while i < n:
        size = min(txn_size, n - i)
        commit = rng.random() >= abort_rate
        records = []
        for j in range(i, i + size):
            head = json.dumps({"id": j, "txn": txn, "committed": commit, "ts": 1_700_000_000_000 + j,
                               "payload": ""})[:-3]
            body = pad[j % value_bytes: j % value_bytes + max(0, value_bytes - len(head) - 3)]
            value = f'{head}"{body}"}}'.encode()
            headers = [("trace", f"t-{j}".encode()), ("n", None)] if j % 10 == 0 else None
            records.append((j % TOPIC_PARTITIONS, f"k{j}".encode(), value, headers))
        _write_transaction(producer, topic, records, commit, produced)
        i += size
        txn += 1
    producer.flush(30)
    return produced


def write_marker_topic(bootstrap: str, topic: str, admin: Any) -> tuple[Any, Any, Produced]:
    """Partition 0: aborted txns then one committed txn; partition 1: aborted txns only.

    Returns the two marker-only ranges: p0 ``[0, end of the aborts)`` (more data follows) and
    p1 ``[0, LSO)`` (the range ends at the partition's end).
    """
    from offsets.ledger import Range

    produced = Produced()
    producer = _producer(bootstrap)
    for t in range(3):
        for p in (0, 1):
            recs = [(p, f"a{t}-{k}".encode(), b'{"aborted": true}', None) for k in range(20)]
            _write_transaction(producer, topic, recs, False, produced)
    mid_end = admin.bounds([(topic, 0)])[(topic, 0)].stable_end
    _write_transaction(producer, topic, [(0, b"c", b'{"committed": true}', None) for _ in range(5)], True,
                       produced)
    tail_end = admin.bounds([(topic, 1)])[(topic, 1)].stable_end
    return Range(topic, 0, 0, mid_end), Range(topic, 1, 0, tail_end), produced


# -- readers ------------------------------------------------------------------------


def make_readers(spark: Any, bootstrap: str, only: tuple[str, ...] = READERS) -> dict[str, Callable[[list[Any]], Any]]:
    from bench.diagnostics.pyds_kafka import TidemarkKafkaDataSource
    from connectors.kafka_config import spark_options
    from infra.spark import V1_SOURCES
    from offsets.ledger import Intent
    from pipelines.transform import read_ranges
    from tidemark.config import KafkaConnection

    spark.dataSource.register(TidemarkKafkaDataSource)
    options = spark_options(KafkaConnection(), bootstrap)

    def spark_source(ranges: list[Any]) -> Any:
        intent = Intent("reader-bench", 1, "bench", datetime.now(UTC), tuple(ranges))
        return read_ranges(spark, options, intent)

    def spark_v1(ranges: list[Any]) -> Any:
        # The relation is chosen when the frame is built (load), so the setting is needed only then.
        key = "spark.sql.sources.useV1SourceList"
        mine = spark.conf.get(key)
        spark.conf.set(key, V1_SOURCES + ",kafka")  # Spark's default: batch reads of Kafka through V1
        try:
            frame = spark_source(ranges)
        finally:
            spark.conf.set(key, mine)
        if "KafkaRelation" not in frame._jdf.queryExecution().analyzed().toString():
            raise AssertionError("spark-v1 did not read through the V1 relation")
        return frame

    def pyds(ranges: list[Any]) -> Any:
        spec = [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in ranges]
        return (spark.read.format(TidemarkKafkaDataSource.name())
                .option("kafka.bootstrap.servers", bootstrap)
                .option("ranges", json.dumps(spec))
                .option("includeHeaders", "true")
                .load())

    readers = {"spark": spark_source, "spark-v1": spark_v1, "pyds": pyds}
    return {name: readers[name] for name in only}


def fingerprint(df: Any) -> dict[tuple[str, int, int], int]:
    rows = df.selectExpr(
        "topic", "partition", "offset",
        "xxhash64(key, value, timestamp, timestampType, headers) AS h").collect()
    out = {(r.topic, r.partition, r.offset): r.h for r in rows}
    if len(out) != len(rows):
        raise AssertionError(f"duplicate (topic, partition, offset) rows: {len(rows)} rows, {len(out)} distinct")
    return out


def timed_scan(df: Any, jvm: Any = None) -> tuple[float, int, int, float]:
    """(seconds, rows, value bytes, CPU seconds of the driver JVM ``jvm``, a psutil process, or NaN)."""
    cpu = (lambda: sum(jvm.cpu_times()[:2])) if jvm is not None else (lambda: float("nan"))
    start, cpu_start = time.perf_counter(), cpu()
    row = df.selectExpr("count(*) AS n", "coalesce(sum(length(value)), 0) AS b").collect()[0]
    return time.perf_counter() - start, int(row.n), int(row.b), cpu() - cpu_start


# -- main ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    from connectors.admin import KafkaAdmin
    from connectors.kafka_config import librdkafka_config
    from infra import jars as jar_cache
    from infra.kafka import EmbeddedKafka
    from infra.process import free_port_block
    from infra.spark import build_session, versions
    from offsets.ledger import Range
    from tidemark.config import KafkaConnection
    from tidemark.settings import load_settings

    settings = load_settings()
    state = Path(tempfile.mkdtemp(prefix="tidemark-reader-bench-"))
    cluster: EmbeddedKafka | None = None
    spark = None
    started = time.perf_counter()
    load_before = loadavg()
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
            broker_version = "external"
        else:
            jars = jar_cache.resolve(settings.home_dir, "kafka")
            cluster = EmbeddedKafka(state / "kafka", jars, port=free_port_block(2, start=28092), heap=settings.kafka.heap)
            print(f"starting Kafka on {cluster.bootstrap_servers} (state {state}) ...", flush=True)
            cluster.start()
            bootstrap = cluster.bootstrap_servers
            broker_version = cluster.version

        run_id = uuid.uuid4().hex[:6]
        topic, marker_topic = f"bench-{run_id}", f"bench-markers-{run_id}"
        admin_client = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin_client.create_topics(
            [NewTopic(topic, TOPIC_PARTITIONS, 1), NewTopic(marker_topic, 2, 1)], operation_timeout=30)
        for f in futures.values():
            f.result(30)

        t0 = time.perf_counter()
        produced = write_main_topic(bootstrap, topic, args.records, value_bytes=args.value_bytes,
                                    txn_size=args.txn_size, abort_rate=args.abort_rate, seed=args.seed)
        write_s = time.perf_counter() - t0
        admin = KafkaAdmin(librdkafka_config(KafkaConnection(), bootstrap))
        bounds = admin.bounds([(topic, p) for p in range(TOPIC_PARTITIONS)])
        ranges = [Range(topic, p, 0, b.stable_end) for (_, p), b in sorted(bounds.items())]
        mid_range, tail_range, _marker_produced = write_marker_topic(bootstrap, marker_topic, admin)
        admin.close()
        expected = len(produced.committed)
        print(f"wrote {args.records:,} records in {produced.transactions['committed']} committed + "
              f"{produced.transactions['aborted']} aborted transactions ({write_s:.1f}s); "
              f"{expected:,} committed, {produced.value_bytes / 1e6:.1f} MB of committed values; "
              f"ranges {[(r.partition, r.start, r.end) for r in ranges]}; marker-only ranges "
              f"{(mid_range.partition, mid_range.start, mid_range.end)} (data follows), "
              f"{(tail_range.partition, tail_range.start, tail_range.end)} (ends at LSO)", flush=True)

        t0 = time.perf_counter()
        spark = build_session(settings, "tidemark-reader-bench", warehouse=state / "warehouse")
        print(f"Spark session in {time.perf_counter() - t0:.1f}s", flush=True)
        readers = make_readers(spark, bootstrap, args.only)
        import psutil

        gateway = spark._jvm
        assert gateway is not None, "a classic (py4j) session, not Spark Connect"
        jvm = psutil.Process(int(gateway.java.lang.ProcessHandle.current().pid()))

        # 1. Correctness (untimed; also warms up the JVM, the Python workers and the broker's page cache).
        expected_keys = produced.committed
        prints: dict[str, dict[tuple[str, int, int], int]] = {}
        for name, reader in readers.items():
            t0 = time.perf_counter()
            fp = fingerprint(reader(ranges))
            prints[name] = fp
            missing, extra = expected_keys - fp.keys(), fp.keys() - expected_keys
            leaked = fp.keys() & produced.aborted
            print(f"check {name}: {len(fp):,} rows in {time.perf_counter() - t0:.1f}s; missing {len(missing)}, "
                  f"unexpected {len(extra)}, aborted leaked {len(leaked)}", flush=True)
            if missing or extra:
                raise AssertionError(f"{name} rows differ from the committed records: missing "
                                     f"{sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
        first = next(iter(prints))
        for name, fp in prints.items():
            if fp != prints[first]:
                diff = [k for k in prints[first] if prints[first][k] != fp.get(k)]
                raise AssertionError(f"{name} and {first}: same offsets but different content at {len(diff)} rows, "
                                     f"e.g. {diff[:5]}")
        for name, reader in readers.items():
            for label, rng_ in (("mid", mid_range), ("tail", tail_range)):
                fp = fingerprint(reader([rng_]))
                if fp:
                    raise AssertionError(f"{name} returned {len(fp)} rows from the marker-only {label} range")
        print(f"check: {', '.join(readers)} return exactly the committed records, with identical content "
              "(key, value, timestamp, timestampType, headers); marker-only ranges empty", flush=True)

        # 2. Timing, alternating the order.
        times: dict[str, list[float]] = {n: [] for n in readers}
        cpus: dict[str, list[float]] = {n: [] for n in readers}
        marker_times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in readers for k in ("mid", "tail")}
        for rep in range(args.reps):
            order = list(readers) if rep % 2 == 0 else list(reversed(readers))
            for name in order:
                secs, n, nbytes, cpu = timed_scan(readers[name](ranges), jvm)
                if n != expected or nbytes != produced.value_bytes:
                    raise AssertionError(f"{name} rep {rep}: {n} rows / {nbytes} bytes, expected "
                                         f"{expected} / {produced.value_bytes}")
                times[name].append(secs)
                cpus[name].append(cpu)
                for label, rng_ in (("mid", mid_range), ("tail", tail_range)):
                    msecs, mn, _, _ = timed_scan(readers[name]([rng_]))
                    if mn != 0:
                        raise AssertionError(f"{name} read {mn} rows from marker-only range {label}")
                    marker_times[(name, label)].append(msecs)
                print(f"rep {rep + 1}/{args.reps} {name}: {secs:.2f}s ({expected / secs:,.0f} rec/s), "
                      f"driver CPU {cpu:.2f}s; "
                      f"marker-only mid {marker_times[(name, 'mid')][-1]:.2f}s, "
                      f"tail {marker_times[(name, 'tail')][-1]:.2f}s", flush=True)

        # 3. Report.
        vers = versions(settings)
        import confluent_kafka
        import pyarrow

        med = {n: statistics.median(v) for n, v in times.items()}
        med_cpu = {n: statistics.median(v) for n, v in cpus.items()}
        base = "spark" if "spark" in readers else next(iter(readers))
        paired = {n: [t / s for t, s in zip(times[n], times[base], strict=True)] for n in readers if n != base}
        lines = [
            "",
            *header("Exact-range read benchmark", load_before),
            (f"Versions: pyspark {vers['pyspark']}, spark-sql-kafka {vers['spark-sql-kafka (jar)']}, "
            f"confluent-kafka {confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]}), "
            f"pyarrow {pyarrow.__version__}, Kafka broker {broker_version}; master {settings.spark.master}."),
            (f"Data: {args.records:,} records written, {produced.transactions['committed']} committed / "
            f"{produced.transactions['aborted']} aborted transactions of {args.txn_size} records over "
            f"{TOPIC_PARTITIONS} partitions; {expected:,} committed records read, "
            f"{produced.value_bytes / 1e6:.1f} MB of values, headers on every 10th record. "
            f"Action: `count(*), sum(length(value))`; {args.reps} reps, order alternating."),
            "",
            f"| reader | median s | driver JVM CPU s (median) | records/s | time ratio vs {base} | all runs (s) |",
            "|---|---:|---:|---:|---:|---|",
        ]
        labels = {"spark": "Spark `kafka` source, V2 scan (read_ranges, Tidemark's)",
                  "spark-v1": "Spark `kafka` source, V1 relation (Spark's default)",
                  "pyds": "Python Data Source (confluent-kafka)"}
        for name in readers:
            ratio = med[name] / med[base]
            runs = ", ".join(f"{t:.2f}" for t in times[name])
            lines.append(f"| {labels[name]} | {med[name]:.2f} | {med_cpu[name]:.2f} | {expected / med[name]:,.0f} | "
                         f"{ratio:.2f}x | {runs} |")
        lines.append("")
        for name, ratios in paired.items():
            lines.append(f"Paired per-rep time ratio {name}/{base}: {', '.join(f'{r:.2f}' for r in ratios)} "
                         f"(median {statistics.median(ratios):.2f}).")
        lines += [
            "",
            "| marker-only range (0 rows) | " + " | ".join(f"{n} median s" for n in readers) + " |",
            "|---|" + "---:|" * len(readers),
        ]
        for label, rng_ in (("mid", mid_range), ("tail", tail_range)):
            desc = ("aborted txns + markers, committed data follows" if label == "mid"
                    else "aborted txns + markers up to the LSO")
            lines.append(f"| {desc} [{rng_.start},{rng_.end}) | " + " | ".join(
                f"{statistics.median(marker_times[(n, label)]):.2f}" for n in readers) + " |")
        lines.append("")
        lines.append(f"Total wall time {time.perf_counter() - started:.0f}s.")
        emit(lines, args.output)
        figures: dict[str, object] = {
            "benchmark": "reader_bench", "records": args.records, "committed_records": expected,
            "reps": args.reps, "readers": list(readers), "seconds": times, "driver_cpu_seconds": cpus,
            "median_seconds": med, "median_driver_cpu_seconds": med_cpu,
            "median_marker_only_seconds": {n: {label: statistics.median(marker_times[(n, label)])
                                               for label in ("mid", "tail")} for n in readers},
            "paired_time_ratios_vs": {"base": base, **{n: statistics.median(r) for n, r in paired.items()}}}
        if "spark" in readers and "spark-v1" in readers:
            figures["ratio_v1_vs_v2_time"] = statistics.median(paired["spark-v1"])
        emit_json(figures, args.json, png=args.png)
        return 0
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception as exc:  # noqa: BLE001
                print(f"stopping Spark failed: {exc}", file=sys.stderr)
        if cluster is not None:
            cluster.stop()
            print("Kafka stopped", flush=True)
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records written, aborted ones included")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per reader")
    parser.add_argument("--value-bytes", type=int, default=1000, help="approximate value size")
    parser.add_argument("--txn-size", type=int, default=400, help="records per transaction")
    parser.add_argument("--abort-rate", type=float, default=0.2, help="fraction of transactions aborted")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of starting an embedded broker")
    parser.add_argument("--pydeps", default=os.environ.get("TIDEMARK_BENCH_PYDEPS"),
                        help="directory with pyarrow (pip install --target DIR pyarrow)")
    parser.add_argument("--only", default=",".join(READERS),
                        help=f"comma-separated readers, in the order of the first rep (of {', '.join(READERS)})")
    parser.add_argument("--output", help="also write the markdown report to this file")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    parser.add_argument("--png", help="also draw the figures as a PNG chart to this file")
    args = parser.parse_args(argv)
    args.only = tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = set(args.only) - set(READERS)
    if unknown or not args.only:
        parser.error(f"--only: unknown reader(s) {', '.join(sorted(unknown)) or '(none named)'}; "
                     f"choose from {', '.join(READERS)}")
    _prepare_python_path(args.pydeps)

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through run()'s finally: Spark and Kafka stop

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
