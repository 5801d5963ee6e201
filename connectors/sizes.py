"""How many bytes an offset of a partition costs, estimated from its next few records.

Kafka tells a client where a partition starts and ends in offsets, never in bytes, so a
byte cap on a batch (``max_bytes_per_batch``) is planned from an estimate: the key,
value and header bytes of the first ``sample`` records at the batch's start offset,
divided by the offsets they span (markers and aborted records included, so they make an
offset cheaper, as they are). The estimate only sizes the plan; the plan's exact ranges
are what the ledger records, so a replay never estimates again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.admin import TP
from tidemark.errors import ServiceUnavailableError


def record_bytes(key: bytes | None, value: bytes | None, headers: object) -> int:
    """What one record weighs in a batch: key + value + header names and values."""
    size = len(key or b"") + len(value or b"")
    for name, data in (headers or []):  # type: ignore[attr-defined]
        size += len(name) + len(data or b"")
    return size


def bytes_per_offset(client_config: Mapping[str, str], starts: Mapping[TP, tuple[int, int]], *,
                     sample: int = 64, timeout: float = 15.0) -> dict[TP, float]:
    """Average bytes per offset at each ``tp``'s ``(start, end)``, from at most ``sample`` records.

    A partition whose sampled range holds no record at all (only markers or aborted
    records) weighs 0 per offset. Partitions with nothing to read are left out.
    """
    todo = {tp: (start, end) for tp, (start, end) in starts.items() if end > start}
    if not todo:
        return {}
    consumer = Consumer({
        **client_config,
        "group.id": f"tidemark-sizes-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        # A few records per partition: no need to fetch megabytes of each.
        "fetch.max.bytes": 4 * 1024 * 1024,
        "max.partition.fetch.bytes": 256 * 1024,
    })
    seen: dict[TP, tuple[int, int]] = {}  # tp -> (records, bytes)
    last: dict[TP, int] = {}
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in todo.items()])
        pending = set(todo)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"sizing the next batch: no records from {sorted(pending)[:5]} within {timeout:.0f}s; "
                    "is the broker reachable?")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            tp = (str(msg.topic()), int(msg.partition() or 0))
            if tp not in pending:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(tp)
                    continue
                raise ServiceUnavailableError(f"sizing the next batch from {tp[0]}[{tp[1]}]: {err}")
            offset = int(msg.offset() or 0)
            if offset >= todo[tp][1]:
                pending.discard(tp)
                continue
            n, b = seen.get(tp, (0, 0))
            seen[tp] = (n + 1, b + record_bytes(msg.key(), msg.value(), msg.headers()))
            last[tp] = offset
            if n + 1 >= sample:
                pending.discard(tp)
                consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.close()
    estimate: dict[TP, float] = {}
    for tp, (start, end) in todo.items():
        n, b = seen.get(tp, (0, 0))
        # Offsets covered: up to the last sampled record, or the whole range if it ran out first.
        covered = (last[tp] + 1 - start) if n >= sample else (end - start)
        estimate[tp] = b / max(covered, 1)
    return estimate
