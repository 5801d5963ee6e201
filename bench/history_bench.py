"""Per-batch cost vs history: one small batch at 10 vs 10,000 versions, with and without maintenance.

Three pipelines side by side in one Spark session, each with its own topic and tables:

* ``fresh``: 10 versions of history;
* ``unmaintained``: ``--versions`` (10,000) versions, one small file per version in the
  target, the ledger and the quarantine, as a pipeline committing every few seconds
  leaves them with no maintenance;
* ``maintained``: the same history with maintenance as shipped: ``tidemark maintain``
  (``pipelines.maintain``) every ``--maintain-every`` versions (720: hourly at one batch
  per 5 s, the default schedule), the last run that many versions before the measurement
  — the worst moment of the cycle, just before the next run.

Each measurement starts as after a restart: a fresh ``IngestJob`` (no in-process state;
the session's JVM is warm, its own start the same for any history) recovers and commits
one batch, timed as the restart's cost (R2); then ``--batches`` batches of ``--records``
records (one bad record each, so the quarantine is appended to as well) are timed one by
one, checkpoints included (Delta writes one every 10 versions): the running job's steady
state. The pipelines alternate within each of ``--reps`` rounds; the figures are the first
batch's seconds and the mean seconds per batch, medians over rounds. Ratios divide by
``fresh``.

How the history is built quickly: committing 10,000 batches through Spark takes hours on
2 cores. One real batch creates each table; its commit is then repeated as versions 2..N
by writing the commit files directly — the same ``commitInfo`` (with the batch's
``userMetadata``), ``txn`` (``txnVersion`` = the batch id) and ``add`` actions Delta wrote,
each add pointing at a new file (a hard link of the real one; ledger rows are rewritten
with their own ``batch_id`` and stats, so data skipping finds each batch's intent).
Beside each commit file go Delta's version checksum and Hadoop's ``.crc`` of both, as a
real commit on a local path leaves them (four ``_delta_log`` entries a version: what a
listing of the log walks). delta-rs then writes a checkpoint of the last version, as
Delta would have. Maintenance
runs are real ``OPTIMIZE``/``VACUUM`` commits between stretches of synthetic versions.

    .venv/bin/python -m bench.history_bench --json docs/bench/history.json --png docs/bench/history.png
    .venv/bin/python -m bench.history_bench --delta-log-store      # the same with Delta's own log store
    .venv/bin/python -m bench.history_bench --s3 --json docs/bench/history-s3.json --png docs/bench/history-s3.png
    .venv/bin/python -m bench.history_bench --day                  # a simulated day, then one maintain
    .venv/bin/python -m bench.history_bench --properties --batches 60   # auto-compaction, optimized writes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments

PIPELINES = ("fresh", "unmaintained", "maintained")


#: ``--s3``: the embedded S3 server's backing directory, where the synthetic history is written
#: directly (as on a local path; the measured batches go through S3).
S3_BACKEND: list[Path] = []


def _local(table: str) -> Path:
    """The directory of ``table`` on this machine: itself, or on ``s3a://`` the S3 server's backing directory."""
    if table.startswith("s3a://"):
        return S3_BACKEND[0] / table.split("://", 1)[1]
    return Path(table)


def _log_file(table: str, version: int) -> Path:
    return _local(table) / "_delta_log" / f"{version:020d}.json"


def _hadoop_checksum(data: bytes) -> bytes:
    """Hadoop's ``.<name>.crc`` for ``data`` (CRC32 of each 512-byte chunk), as the local file system writes it."""
    import struct
    import zlib

    return b"crc\x00" + struct.pack(">i", 512) + b"".join(
        struct.pack(">I", zlib.crc32(data[i:i + 512])) for i in range(0, len(data), 512))


def _as_object(path: Path) -> None:
    """On ``--s3``: give a file written straight into the server's directory the MD5 its store keeps
    as an object's ETag (an extended attribute), which S3A's change detection requires of every
    object it reads. Hard links share it with their file. (Java names the attribute
    ``user.content-md5`` in the ``user`` namespace, so Linux stores it with the prefix twice.)"""
    if S3_BACKEND:
        import hashlib

        os.setxattr(path, "user.user.content-md5", hashlib.md5(path.read_bytes()).digest())


def _write_log_entry(path: Path, data: bytes) -> None:
    """A ``_delta_log`` file and Hadoop's checksum beside it: what a real commit leaves on a local path
    (S3A writes no checksum files)."""
    path.write_bytes(data)
    if S3_BACKEND:
        _as_object(path)
    else:
        path.with_name(f".{path.name}.crc").write_bytes(_hadoop_checksum(data))


def _latest_version(table: str) -> int:
    return max(int(p.name.split(".")[0]) for p in (_local(table) / "_delta_log").glob("*.json"))


class Template:
    """A table's first commit (one real batch's append), kept to be repeated as later versions."""

    def __init__(self, table: str, app_id: str, keep: Path, *, ledger: bool) -> None:
        import pyarrow.parquet as pq

        actions = [json.loads(line) for line in _log_file(table, 0).read_text().splitlines() if line]
        self.info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        self.txn = next(a["txn"] for a in actions if "txn" in a and a["txn"]["appId"] == app_id)
        self.adds = [a["add"] for a in actions if "add" in a]
        self.meta = json.loads(self.info.get("userMetadata") or "{}")
        checksum = _log_file(table, 0).with_suffix(".crc")
        self.checksum = checksum.read_bytes() if checksum.exists() else None
        self.ledger = ledger
        keep.mkdir(parents=True, exist_ok=True)
        self.files = {}
        for add in self.adds:
            self.files[add["path"]] = keep / Path(add["path"]).name
            shutil.copyfile(_local(table) / add["path"], self.files[add["path"]])
            _as_object(self.files[add["path"]])  # and so every hard link of it
        self.rows = {a["path"]: pq.read_table(self.files[a["path"]], coerce_int96_timestamp_unit="us")
                     for a in self.adds} if ledger else {}
        self.int96 = ledger and any("INT96" in str(pq.ParquetFile(f).schema) for f in self.files.values())

    def extend(self, table: str, first_batch: int, count: int) -> None:
        """Versions after the table's newest, one per batch ``first_batch .. first_batch + count - 1``.

        Each repeats the template's commit with its own ``txnVersion``, ``userMetadata`` batch
        and new files; a ledger's files hold a row with that batch id (stats to match).
        """
        import pyarrow as pa
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        head = _latest_version(table)
        now_ms = int(time.time() * 1000)
        for step in range(count):
            batch = first_batch + step
            stamp = now_ms + step
            commit = dict(self.info, timestamp=stamp)
            if "inCommitTimestamp" in commit:
                commit["inCommitTimestamp"] = stamp
            if self.meta:
                commit["userMetadata"] = json.dumps(dict(self.meta, batch=batch, write=uuid.uuid4().hex),
                                                    separators=(",", ":"), sort_keys=True)
            lines = [{"commitInfo": commit}, {"txn": dict(self.txn, version=batch, lastUpdated=stamp)}]
            for add in self.adds:
                name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
                new = dict(add, path=name, modificationTime=stamp)
                if self.ledger:
                    data = self.rows[add["path"]]
                    data = data.set_column(data.schema.get_field_index("batch_id"), "batch_id",
                                           pa.array([batch] * data.num_rows, pa.int64()))
                    pq.write_table(data, _local(table) / name, use_deprecated_int96_timestamps=self.int96)
                    _as_object(_local(table) / name)
                    stats = json.loads(add["stats"])
                    stats["minValues"]["batch_id"] = stats["maxValues"]["batch_id"] = batch
                    new["stats"] = json.dumps(stats, separators=(",", ":"))
                    new["size"] = os.path.getsize(_local(table) / name)
                else:
                    os.link(self.files[add["path"]], _local(table) / name)
                lines.append({"add": new})
            log_file = _log_file(table, head + 1 + step)
            _write_log_entry(log_file, ("\n".join(json.dumps(x, separators=(",", ":")) for x in lines)
                                        + "\n").encode())
            if self.checksum is not None and step < count - 1:
                # Delta's version checksum beside each commit, as on a real log (four entries a
                # version); its content is version 0's, so none is left on the newest version,
                # the only one whose checksum a snapshot load reads.
                _write_log_entry(log_file.with_suffix(".crc"), self.checksum)
        from tidemark.storage import delta_rs_options

        DeltaTable(table, storage_options=delta_rs_options(table)).create_checkpoint()


def _root(work: Path, name: str) -> str:
    return f"s3a://bench/history-{name}-{uuid.uuid4().hex[:6]}" if S3_BACKEND else str(work / name)


class Setup:
    """One pipeline of the benchmark: its topic, config and tables."""

    def __init__(self, name: str, work: Path, bootstrap: str, records: int) -> None:
        from tidemark.config import parse_config

        self.name = name
        self.topic = f"history-{name}-{uuid.uuid4().hex[:6]}"
        self.config = parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [
            {"name": name, "topics": [self.topic], "target": _root(work, name), "schema": "id BIGINT, note STRING",
             "max_records_per_batch": records, "transactions": {"atomic": False},
             "schedule": {"ingest_every_seconds": None, "audit_every_seconds": None}}]})
        self.pipeline = self.config.pipelines[0]
        self.bootstrap = bootstrap

    def produce(self, batches: int, records: int, first: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 20})
        for b in range(batches):
            for i in range(records):
                n = first + b * records + i
                value = b"\xff not json" if i == records - 1 else json.dumps({"id": n, "note": "x" * 200}).encode()
                producer.produce(self.topic, value=value, headers={"id": str(n)})
        producer.flush(60)

    def job(self, spark: Any) -> Any:
        from pipelines.ingest import IngestJob

        return IngestJob(spark, self.config, self.pipeline, self.bootstrap)

    def batch(self, job: Any, records: int) -> float:
        started = time.perf_counter()
        _, result = job.protocol.run_batch(job.snapshot())
        elapsed = time.perf_counter() - started
        if result is None or result.rows + result.quarantined != records:
            raise AssertionError(f"{self.name}: expected a batch of {records} records, got {result}")
        return elapsed

    def keep_templates(self, work: Path) -> None:
        from pipelines.maintain import tables_of

        p = self.pipeline
        self.tables = [path for _, path in tables_of(p)]
        self.templates = [Template(path, p.name, work / "templates" / self.name / str(i), ledger=path == p.ledger_path)
                          for i, path in enumerate(self.tables)]
        self.next_batch = 2

    def grow(self, count: int) -> None:
        """``count`` more batches of history in each table."""
        for path, template in zip(self.tables, self.templates, strict=True):
            template.extend(path, self.next_batch, count)
        self.next_batch += count

    def versions(self) -> int:
        return _latest_version(self.pipeline.target) + 1

    def shape(self) -> dict[str, dict[str, int]]:
        from offsets.tables import table_shape
        from pipelines.maintain import tables_of

        out = {}
        for role, path in tables_of(self.pipeline):
            shape = table_shape(path)
            assert shape is not None
            out[role] = {"version": shape.version, "files": shape.files, "bytes": shape.bytes}
        return out


def simulated_day(args: argparse.Namespace) -> int:
    """``--day``: a day of 5-second batches (17,280 versions), then one ``maintain``: files per table."""
    from infra.spark import build_session
    from pipelines.maintain import maintain
    from tidemark.settings import load_settings

    versions = 24 * 3600 // 5
    work = Path(tempfile.mkdtemp(prefix="tidemark-history-day-"))
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _):
            from confluent_kafka.admin import AdminClient, NewTopic

            spark = build_session(load_settings(), "tidemark-history-day", warehouse=work / "warehouse")
            try:
                s = Setup("day", work, bootstrap, args.records)
                admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
                admin.create_topics([NewTopic(s.topic, 1, 1)])[s.topic].result(30)
                s.produce(1, args.records, 0)
                s.batch(s.job(spark), args.records)
                s.keep_templates(work)
                s.grow(versions - 1)
                before = s.shape()
                started = time.perf_counter()
                maintain(spark, s.pipeline)
                seconds = time.perf_counter() - started
                after = s.shape()
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = ["", (f"A simulated day: {versions:,} versions of {args.records:,}-record batches, then one `maintain` "
             f"({seconds:.0f} s):"), "", "| table | files before | bytes | files after | mean file after |",
             "|---|---:|---:|---:|---:|"]
    for role in before:
        files = after[role]["files"]
        lines.append(f"| {role} | {before[role]['files']:,} | {before[role]['bytes']:,} | {files:,} | "
                     f"{after[role]['bytes'] / max(files, 1) / 2**20:.1f} MiB |")
    emit(lines, args.output)
    emit_json({"benchmark": "history_day", "versions": versions, "before": before, "after": after,
               "maintain_seconds": seconds}, args.json, png=args.png)
    return 0


#: ``--properties``: Delta's streaming-sink table properties, each measured against none.
PROPERTY_SETS = {"none": {}, "auto-compact": {"delta.autoOptimize.autoCompact": "true"},
                 "optimized-writes": {"delta.autoOptimize.optimizeWrite": "true"}}


def table_properties(args: argparse.Namespace) -> int:
    """``--properties``: per-batch cost and files left with Delta's auto-compaction or optimized writes on.

    One pipeline per property set, all three tables with it, alternating batch by batch for
    ``--batches`` batches each (no history synthesized: the commit path is what differs).
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.spark import build_session
    from pipelines.maintain import tables_of
    from tidemark.settings import load_settings

    work = Path(tempfile.mkdtemp(prefix="tidemark-history-props-"))
    load_before = loadavg()
    times: dict[str, list[float]] = {name: [] for name in PROPERTY_SETS}
    shapes: dict[str, dict[str, dict[str, int]]] = {}
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, _):
            spark = build_session(load_settings(), "tidemark-history-props", warehouse=work / "warehouse")
            try:
                admin = AdminClient({"bootstrap.servers": bootstrap})
                setups, jobs = {}, {}
                for name, props in PROPERTY_SETS.items():
                    s = setups[name] = Setup(name, work, bootstrap, args.records)
                    admin.create_topics([NewTopic(s.topic, 1, 1)])[s.topic].result(30)
                    s.produce(args.batches + 1, args.records, 0)
                    jobs[name] = s.job(spark)
                    s.batch(jobs[name], args.records)  # creates the tables
                    for _, path in tables_of(s.pipeline):
                        for key, value in props.items():
                            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{key}' = '{value}')")
                for _ in range(args.batches):
                    for name, s in setups.items():
                        times[name].append(s.batch(jobs[name], args.records))
                shapes = {name: s.shape() for name, s in setups.items()}
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.mean(times["none"])
    lines = [*header("Table properties of a streaming sink: per-batch cost and files", load_before), "",
             f"{args.batches} batches of {args.records:,} records per pipeline, alternating.", "",
             "| properties | mean s/batch | vs none | p95 s | max s | target files | ledger files |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for name, values in times.items():
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        summary[name] = {"mean": statistics.mean(values), "p95": p95, "max": ordered[-1],
                         "ratio_vs_none": statistics.mean(values) / base, "tables": shapes[name]}
        lines.append(f"| {name} | {summary[name]['mean']:.3f} | {summary[name]['ratio_vs_none']:.2f}x | {p95:.3f} | "
                     f"{ordered[-1]:.3f} | {shapes[name]['target']['files']} | {shapes[name]['ledger']['files']} |")
    emit(lines, args.output)
    emit_json({"benchmark": "history_properties", "batches": args.batches, "records": args.records,
               "properties": PROPERTY_SETS, "seconds_per_batch": times, "summary": summary}, args.json, png=args.png)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10_000, help="history of the long pipelines")
    parser.add_argument("--fresh", type=int, default=10, help="history of the short pipeline")
    parser.add_argument("--maintain-every", type=int, default=720, help="versions between maintenance runs")
    parser.add_argument("--records", type=int, default=1_000, help="records per measured batch")
    parser.add_argument("--batches", type=int, default=10, help="measured batches per pipeline and round")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--day", action="store_true",
                        help="instead: a simulated day of 5-second batches, then one maintain; files per table")
    parser.add_argument("--delta-log-store", action="store_true",
                        help="list _delta_log with Delta's own HDFSLogStore, not Tidemark's (what it buys)")
    parser.add_argument("--s3", action="store_true",
                        help="every table on s3a:// on the embedded S3 server (Tidemark's S3 log store)")
    parser.add_argument("--properties", action="store_true",
                        help="instead: per-batch cost with Delta's auto-compaction / optimized writes on vs off")
    report_arguments(parser)
    args = parser.parse_args(argv)
    if args.day:
        return simulated_day(args)
    if args.properties:
        return table_properties(args)

    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.spark import build_session
    from pipelines.maintain import maintain
    from tidemark.settings import load_settings

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-history-bench-"))
    storage = ExitStack()
    if args.s3:
        from bench.s3_bench import s3_server

        storage.enter_context(s3_server())
        S3_BACKEND.append(Path(os.environ["TIDEMARK_S3__CREDENTIALS_FILE"]).parent / "data")
    per_batch: dict[str, list[float]] = {n: [] for n in PIPELINES}
    runs: dict[str, list[list[float]]] = {n: [] for n in PIPELINES}
    restarts: dict[str, list[float]] = {n: [] for n in PIPELINES}
    shapes: dict[str, Any] = {}
    maintain_runs = 0
    try:
        with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
            spark = build_session(load_settings(), "tidemark-history-bench", warehouse=work / "warehouse",
                                  without=("spark.delta.logStore.file.impl",) if args.delta_log_store else ())
            try:
                setups = {n: Setup(n, work, bootstrap, args.records) for n in PIPELINES}
                admin = AdminClient({"bootstrap.servers": bootstrap})
                for s in setups.values():
                    admin.create_topics([NewTopic(s.topic, 1, 1)])[s.topic].result(30)
                    s.produce(1 + args.reps * (args.batches + 1), args.records, 0)
                for name, s in setups.items():
                    t0 = time.perf_counter()
                    s.batch(s.job(spark), args.records)  # creates the three tables (version 0)
                    s.keep_templates(work)
                    target = args.fresh if name == "fresh" else args.versions
                    if name == "maintained":
                        # Maintenance every --maintain-every versions; the last run that long before the end.
                        while target - s.versions() > args.maintain_every:
                            s.grow(min(args.maintain_every, target - s.versions() - args.maintain_every))
                            maintain(spark, s.pipeline)
                            maintain_runs += 1
                    s.grow(max(1, target - s.versions()))
                    shapes[name] = s.shape()
                    print(f"{name}: history made in {time.perf_counter() - t0:.0f}s: {shapes[name]}", flush=True)
                for rep in range(args.reps):
                    order = PIPELINES if rep % 2 == 0 else tuple(reversed(PIPELINES))
                    for name in order:
                        s = setups[name]
                        job = s.job(spark)
                        restart = s.batch(job, args.records)  # recover after the "restart", then one batch
                        restarts[name].append(restart)
                        times = [s.batch(job, args.records) for _ in range(args.batches)]
                        runs[name].append(times)
                        per_batch[name].append(statistics.mean(times))
                        print(f"rep {rep + 1} {name}: first batch after the restart {restart:.3f}s; then mean "
                              f"{statistics.mean(times):.3f}s per batch (median {statistics.median(times):.3f}, "
                              f"max {max(times):.3f})", flush=True)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        storage.close()

    med = {n: statistics.median(v) for n, v in per_batch.items()}
    ratios = {n: med[n] / med["fresh"] for n in PIPELINES}
    restart_med = {n: statistics.median(v) for n, v in restarts.items()}
    restart_ratios = {n: restart_med[n] / restart_med["fresh"] for n in PIPELINES}
    files = {n: shapes[n]["target"]["files"] for n in PIPELINES}
    store = ("Tidemark's S3 log store on s3a:// (--s3; S3's start-after)" if args.s3 else
             "Delta's own HDFSLogStore (--delta-log-store)" if args.delta_log_store else "Tidemark's log store")
    lines = ["", *header("Per-batch cost vs history", load_before),
             (f"Kafka {broker_version}, one broker, one partition; batches of {args.records:,} records (~230 B, "
              f"one bad); {args.batches} timed batches per pipeline and round after one warm-up, {args.reps} "
              f"rounds; maintenance every {args.maintain_every} versions ({maintain_runs} runs), the last "
              f"{args.maintain_every} versions before the measurement. _delta_log listed by {store}."), "",
             ("| pipeline | versions of history | target files | first batch after a restart s | ratio to fresh | "
              "mean s per batch (median of rounds) | rounds (s) | ratio to fresh |"),
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for n in PIPELINES:
        lines.append(f"| {n} | {shapes[n]['target']['version']:,} | {files[n]:,} | {restart_med[n]:.3f} | "
                     f"{restart_ratios[n]:.2f}× | {med[n]:.3f} | {', '.join(f'{t:.3f}' for t in per_batch[n])} | "
                     f"{ratios[n]:.2f}× |")
    lines += ["", (f"**{args.versions:,} versions with maintenance as shipped: {ratios['maintained']:.2f}× the "
                   f"cost of a batch at {args.fresh} versions; without maintenance {ratios['unmaintained']:.2f}×. "
                   f"The first batch after a restart: {restart_ratios['maintained']:.2f}× and "
                   f"{restart_ratios['unmaintained']:.2f}×.**")]
    emit(lines, args.output)
    emit_json({"benchmark": "history_bench", "versions": args.versions, "fresh_versions": args.fresh,
               "maintain_every": args.maintain_every, "records": args.records, "batches": args.batches,
               "reps": args.reps, "log_store": "s3" if args.s3 else "delta" if args.delta_log_store else "tidemark",
               "seconds_per_batch": med, "rounds": per_batch, "runs": runs, "shapes": shapes,
               "ratio_maintained": ratios["maintained"], "ratio_unmaintained": ratios["unmaintained"],
               "restart_seconds": restart_med, "restart_rounds": restarts,
               "ratio_restart_maintained": restart_ratios["maintained"],
               "ratio_restart_unmaintained": restart_ratios["unmaintained"]},
              args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
