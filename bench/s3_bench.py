"""Ingest to ``s3a://`` against the same to a local path, and Tidemark against Structured Streaming on S3.

One broker, one topic (``bench.ingest_bench``'s records: ~1 KB JSON over 8 partitions), one
SparkSession with ``TIDEMARK_STORAGE=s3`` against the embedded S3 server (s3proxy on a local
directory, conditional creates atomic; started here on a free port). Contenders, each run into
a fresh table, the order rotating over ``--reps``, each run verified exactly-once:

* ``tidemark-local``: ``IngestJob.run_bounded()`` into a local path;
* ``tidemark-s3``: the same into ``s3a://`` (target, quarantine, ledger; Tidemark's S3 log store);
* ``structured-streaming-s3``: ``readStream kafka → writeStream delta`` (AvailableNow) into
  ``s3a://`` (its checkpoint on the local disk: see :func:`structured_streaming_s3`), with
  Tidemark's Kafka fetch settings.

Reported: median seconds and records/s, and the ratios S3 vs local and Tidemark vs Structured
Streaming on S3. The S3 server runs on this machine, so S3 here costs the protocol's requests
and the server's CPU, not a network's latency.

    .venv/bin/python -m bench.s3_bench --reps 2 --json docs/bench/s3.json --png docs/bench/s3.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments
from bench.ingest_bench import (
    PEER_KAFKA_OPTIONS,
    new_topic,
    produce,
    run_structured_streaming,
    run_tidemark,
    verify,
)


@contextmanager
def s3_server() -> Iterator[str]:
    """The embedded S3 server on a free port, this process's settings pointed at it; yields the bucket."""
    from infra.process import free_port
    from infra.s3 import EmbeddedS3
    from tidemark.settings import load_settings, settings

    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-s3-"))
    server = EmbeddedS3(root, load_settings().home_dir, port=free_port(), bucket="bench")
    server.start()
    os.environ.update({"TIDEMARK_STORAGE": "s3", "TIDEMARK_S3__ENDPOINT": server.endpoint,
                       "TIDEMARK_S3__CREDENTIALS_FILE": str(server.credentials), "TIDEMARK_S3__BUCKET": "bench"})
    settings.cache_clear()  # the process-wide settings read these from now on
    try:
        yield "bench"
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


#: Where the peer's checkpoints go (set in main): a local directory.
CHECKPOINTS: list[Path] = []


def structured_streaming_s3(spark: Any, bootstrap: str, topic: str, target: str) -> tuple[int, int]:
    """The peer into an ``s3a://`` table, its checkpoint on the local disk: its checkpoint manager
    creates files through Hadoop's FileContext, which on S3A asks for the parent directory's status,
    and the embedded server (s3proxy over a directory) does not answer for an empty one. The
    checkpoint off S3 only spares the peer requests (Tidemark's ledger is on S3)."""
    return run_structured_streaming(spark, bootstrap, topic, target, CHECKPOINTS[0] / f"cp-{uuid.uuid4().hex[:8]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=2, help="runs per contender, order rotating")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    report_arguments(parser)
    args = parser.parse_args(argv)
    from pipelines.transform import BULK_READ_OPTIONS

    PEER_KAFKA_OPTIONS.update(BULK_READ_OPTIONS)  # the peer reads Kafka as Tidemark does: only the sinks differ

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-s3-bench-"))
    CHECKPOINTS.append(work)
    names = ("tidemark-local", "tidemark-s3", "structured-streaming-s3")
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        with s3_server() as bucket, kafka_broker(args.bootstrap) as (bootstrap, broker_version):
            from infra.spark import build_session
            from tidemark.settings import load_settings

            settings = load_settings()
            topic = new_topic(bootstrap, "bench-s3")
            produce(bootstrap, topic, args.records, value_bytes=1000, txn_size=1000, seed=7)
            spark = build_session(settings, "tidemark-s3-bench", warehouse=work / "warehouse")

            def target(name: str, rep: int | str) -> str:
                where = f"s3a://{bucket}/{name}-{rep}-{uuid.uuid4().hex[:6]}" if name.endswith("-s3") \
                    else str(work / f"{name}-{rep}")
                return where

            runs: dict[str, Callable[[Any, str, str, str], tuple[int, int]]] = {
                "tidemark-local": run_tidemark,  # type: ignore[dict-item]
                "tidemark-s3": run_tidemark,  # type: ignore[dict-item]
                "structured-streaming-s3": structured_streaming_s3}
            try:
                for name in names:  # untimed warm-up of each: JVM, S3A's clients, the broker's page cache
                    runs[name](spark, bootstrap, topic, target(name, "warm"))
                for rep in range(args.reps):
                    order = list(names[rep % 3:] + names[:rep % 3])
                    for name in order if rep % 2 == 0 else reversed(order):
                        where = target(name, rep)
                        started = time.perf_counter()
                        rows, batches = runs[name](spark, bootstrap, topic, where)
                        elapsed = time.perf_counter() - started
                        if rows != args.records:
                            raise AssertionError(f"{name}: {rows} rows, expected {args.records}")
                        verify(spark, where, args.records)
                        times[name].append(elapsed)
                        print(f"rep {rep + 1} {name}: {elapsed:.1f}s, {args.records / elapsed:,.0f} records/s, "
                              f"{batches} batch(es)", flush=True)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {n: statistics.median(t) for n, t in times.items()}
    s3_vs_local = med["tidemark-local"] / med["tidemark-s3"]
    vs_peer = med["structured-streaming-s3"] / med["tidemark-s3"]
    lines = ["", *header("Ingest to s3a:// (embedded S3 server) vs a local path; Tidemark vs Structured Streaming "
                         "on S3", load_before),
             (f"Data: {args.records:,} JSON records of ~1 KB in 8 partitions; Kafka {broker_version}; each run into "
             "a fresh table, verified exactly-once; one untimed run of each contender first."), "",
             "| contender | median s | records/s | all runs (s) |", "|---|---:|---:|---|"]
    for n in names:
        lines.append(f"| {n} | {med[n]:.1f} | {args.records / med[n]:,.0f} | "
                     f"{', '.join(f'{t:.1f}' for t in times[n])} |")
    lines += ["", (f"**Tidemark on S3 / Tidemark local (throughput) = {s3_vs_local:.2f}×**; "
              f"**Tidemark / Structured Streaming, both on S3 = {vs_peer:.2f}×** (median times).")]
    emit(lines, args.output)
    emit_json({"benchmark": "s3_bench", "records": args.records, "reps": args.reps, "seconds": times,
               "median_seconds": med, "ratio_s3_vs_local": s3_vs_local,
               "ratio_vs_structured_streaming_s3": vs_peer}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
