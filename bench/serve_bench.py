"""Scheduled runs under ``tidemark serve``: seconds from a run's start to its first fetch, warm driver vs a JVM per run.

The target: a served run (second and later) spends < 1 s before its first Kafka
fetch. Both modes serve the same pipeline on the same broker in one benchmark run, one
after the other, while a producer writes a 200-record transaction every 0.5 s so every
run has work: ``tidemark serve`` (the warm driver) and ``tidemark serve
--no-warm-driver`` (each flow run starts its own Spark driver).

"Before the first fetch" is what each run logs itself (orchestration.flows): from the
flow run's start as Prefect records it (its Running state) to the moment its first
batch starts planning (orchestration.jobs.ingest), before which no record is fetched.
Prefect's own latency before the Running state (the Runner polling for due runs, the
flow-run process starting) is outside both figures and the same for both modes; the
flow run's total duration and the process tree's peak RSS are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, emit, emit_json, header, kafka_broker, loadavg, report_arguments

LINE = re.compile(r"(?P<pipeline>[\w-]+): (?P<batches>\d+) batch\(es\), (?P<rows>\d+) rows, .*?; "
                  r"fetching (?P<seconds>[\d.]+|None)s after the run started")


class Producer(threading.Thread):
    """One 200-record transaction every 0.5 s until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": f"serve-bench-{os.getpid()}",
                                       "linger.ms": 5})
        self.producer.init_transactions(30)
        self.topic = topic
        self.stopping = threading.Event()
        self.next_id = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            self.producer.begin_transaction()
            for _ in range(200):
                self.producer.produce(self.topic, json.dumps({"id": self.next_id, "note": "n" * 200}).encode())
                self.next_id += 1
            self.producer.commit_transaction(30)
            self.stopping.wait(0.5)


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def serve_runs(mode: str, bootstrap: str, topic: str, api: str, work: Path, runs: int, every: float,
               timeout: float) -> dict[str, Any]:
    """Serve one pipeline until ``runs`` ingest runs completed; each run's logged seconds before fetching."""
    name = f"bench-{mode}"
    config = work / f"{mode}.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [{
        "name": name, "topics": [topic], "target": str(work / name), "schema": "id BIGINT, note STRING",
        "schedule": {"ingest_every_seconds": every, "audit_every_seconds": None, "maintain_every_seconds": None},
    }]}))
    argv = [sys.executable, "-m", "tidemark.cli", "serve", "--config", str(config)]
    if mode == "cold":
        argv.append("--no-warm-driver")
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(work / "prefect-home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    log = work / f"serve-{mode}.log"
    started = time.monotonic()
    peak = 0
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        found: list[dict[str, Any]] = []
        while len(found) < runs:
            if proc.poll() is not None or time.monotonic() - started > timeout:
                raise SystemExit(f"serve ({mode}) gave {len(found)} of {runs} runs; see {log}")
            peak = max(peak, _tree_rss(proc.pid))
            found = [m.groupdict() for m in LINE.finditer(log.read_text(errors="replace")) if m["pipeline"] == name]
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    seconds = [float(m["seconds"]) for m in found[:runs] if m["seconds"] != "None"]
    return {"mode": mode, "seconds_before_fetching": seconds, "rows": [int(m["rows"]) for m in found[:runs]],
            "peak_rss_bytes": peak, "wall_seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="completed ingest runs per mode (the tenth is reported)")
    parser.add_argument("--every", type=float, default=10.0, help="the ingest schedule's interval, seconds")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    parser.add_argument("--timeout", type=float, default=900, help="per mode")
    report_arguments(parser)
    args = parser.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from infra.prefect_server import EmbeddedPrefect
    from infra.process import free_port

    load_before = loadavg()
    work = Path(tempfile.mkdtemp(prefix="tidemark-serve-bench-"))
    prefect = EmbeddedPrefect(work / "prefect", port=free_port())
    results: dict[str, dict[str, Any]] = {}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
        api = prefect.start()
        try:
            for mode in ("warm", "cold"):
                topic = f"serve-bench-{mode}-{os.getpid()}"
                admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its futures
                admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
                producer = Producer(bootstrap, topic)
                producer.start()
                try:
                    print(f"serving ({mode}) until {args.runs} runs completed ...", flush=True)
                    results[mode] = serve_runs(mode, bootstrap, topic, api, work, args.runs, args.every,
                                               args.timeout)
                finally:
                    producer.stopping.set()
                    producer.join(60)
        finally:
            prefect.stop()

    def later(mode: str) -> float:
        return statistics.median(results[mode]["seconds_before_fetching"][1:])

    ratio = later("cold") / later("warm")
    lines = header("Scheduled runs under tidemark serve: warm driver vs a Spark driver per run", load_before)
    lines += [(f"Broker {broker_version}; one pipeline, ingest every {args.every:g} s, a 200-record transaction "
              "produced every 0.5 s; seconds from each flow run's start to its first batch's planning."), "",
              "| mode | 1st run | 10th run | median of runs 2+ | max of runs 2+ | peak RSS of serve's tree |",
              "|---|---:|---:|---:|---:|---:|"]
    for mode, r in results.items():
        s = r["seconds_before_fetching"]
        tenth = f"{s[9]:.2f}" if len(s) >= 10 else "–"
        lines.append(f"| {mode} | {s[0]:.2f} | {tenth} | {later(mode):.2f} | {max(s[1:]):.2f} | "
                     f"{r['peak_rss_bytes'] / 2**30:.2f} GiB |")
    lines += ["", (f"A JVM per run spends **{ratio:.1f}×** the warm driver's time before its first fetch "
              f"(runs 2 and later; target < 1 s warm: {'met' if later('warm') < 1 else 'not met'}).")]
    emit(lines, args.output)
    emit_json({"benchmark": "serve_bench", "runs": args.runs, "every_seconds": args.every,
               "modes": results, "median_later_seconds": {m: later(m) for m in results},
               "ratio_cold_vs_warm": ratio}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
