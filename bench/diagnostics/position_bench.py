"""The relay's start-up read of its position: 10 vs 1,000,000 positions in the offsets topic.

A relay reads its position at every start and after every re-fence. Its first reader
read the whole offsets topic to its LSO (``old``: one record and one commit marker per
Kafka transaction, ever); now it reads the partition's tail first, stepping back only
while its key is missing (``tail``, :func:`outbox.position.read_position`). Both read the
same topics in the same run: one with 10 positions, one with ``--positions`` (1,000,000),
written as the relay writes them (one per Kafka transaction; here 1,000 per transaction
to build the topic in seconds: the markers make no difference to either reader's cost
per record). Compaction is left out on purpose: the cleaner runs when it likes, and a
start-up must not depend on it.

    .venv/bin/python -m bench.diagnostics.position_bench                 # 1,000,000 positions, 3 reps
    .venv/bin/python -m bench.diagnostics.position_bench --positions 100000 --reps 1 --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

from bench.common import emit, emit_json, header, kafka_broker, loadavg, report_arguments


def fill(bootstrap: str, topic: str, positions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from outbox.position import OFFSETS_TOPIC_CONFIG, Position

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=OFFSETS_TOPIC_CONFIG)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "linger.ms": 20})
    producer.init_transactions(30)
    for start in range(0, positions, 1000):
        producer.begin_transaction()
        for i in range(start, min(start + 1000, positions)):
            producer.produce(topic, key=b"bench", value=Position(i, i, "-").to_json("bench"))
        producer.commit_transaction(60)


def read_old(bootstrap: str, topic: str) -> int:
    """The first reader: every record of the topic, read_committed, to its end."""
    from connectors.topic_reader import read_to_end
    from outbox.position import Position

    found = [Position.from_json(r.value) for r in read_to_end(bootstrap, topic, timeout=600)
             if r.key == b"bench" and r.value]
    return max(found, key=lambda p: p.end_lsn).end_lsn


def read_tail(bootstrap: str, topic: str) -> int:
    from outbox.position import read_position

    position = read_position({"bootstrap.servers": bootstrap}, topic, "bench")
    assert position is not None
    return position.end_lsn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a fresh embedded broker")
    report_arguments(parser)
    args = parser.parse_args(argv)

    load_before = loadavg()
    sizes = {"10": 10, f"{args.positions:,}": args.positions}
    times: dict[tuple[str, str], list[float]] = {}
    with kafka_broker(args.bootstrap) as (bootstrap, broker_version):
        topics = {}
        for label, n in sizes.items():
            topics[label] = f"bench.positions.{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            fill(bootstrap, topics[label], n)
            print(f"{n:,} positions written in {time.perf_counter() - started:.0f}s", flush=True)
        for rep in range(args.reps):
            for label, n in sizes.items():
                for name, reader in (("old", read_old), ("tail", read_tail)):
                    started = time.perf_counter()
                    assert reader(bootstrap, topics[label]) == n - 1
                    elapsed = time.perf_counter() - started
                    times.setdefault((name, label), []).append(elapsed)
                    print(f"rep {rep + 1} {name} at {label} positions: {elapsed:.3f}s", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    big, small = f"{args.positions:,}", "10"
    growth = {name: med[(name, big)] / med[(name, small)] for name in ("old", "tail")}
    lines = ["", *header("Relay start-up: reading the position at 10 vs many positions", load_before),
             f"Kafka {broker_version}, one broker; one offsets partition; medians of {args.reps} reps.", "",
             "| reader | 10 positions (s) | " + big + " positions (s) | growth |", "|---|---:|---:|---:|"]
    for name in ("old", "tail"):
        lines.append(f"| {name} | {med[(name, small)]:.3f} | {med[(name, big)]:.3f} | {growth[name]:.2f}× |")
    lines += ["", (f"**Start-up at {big} positions / at 10: {growth['tail']:.2f}× (tail read) vs "
                   f"{growth['old']:.1f}× (whole topic).**")]
    emit(lines, args.output)
    emit_json({"benchmark": "position_bench", "positions": args.positions, "reps": args.reps,
               "seconds": {f"{n}@{label}": v for (n, label), v in med.items()},
               "growth_tail": growth["tail"], "growth_old": growth["old"]}, args.json, png=args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
