"""How many bytes an offset of a partition costs, estimated from its next few records.

Kafka tells a client where a partition starts and ends in offsets, never in bytes, so a
byte cap on a batch (``max_bytes_per_batch``) is planned from an estimate: the key,
value and header bytes of the first ``sample`` records at the batch's start offset,
divided by the offsets they span (markers and aborted records included, so they make an
offset cheaper, as they are). The estimate only sizes the plan; the plan's exact ranges
are what the ledger records, so a replay never estimates again.
"""

from __future__ import annotations

from collections.abc import Mapping

from connectors.admin import TP
from connectors.range_reader import RangeReader


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
    records) weighs 0 per offset. Partitions with nothing to read are left out. Read with
    ``connectors.range_reader``'s rules: a start deleted by retention is an error.
    """
    todo = {tp: (start, end) for tp, (start, end) in starts.items() if end > start}
    if not todo:
        return {}
    seen: dict[TP, tuple[int, int]] = {}  # tp -> (records, bytes)
    last: dict[TP, int] = {}
    # A few records per partition: no need to fetch megabytes of each.
    with RangeReader(client_config, [(t, p, start, end) for (t, p), (start, end) in todo.items()],
                     fetch_bytes=4 * 1024 * 1024, partition_fetch_bytes=256 * 1024,
                     stall_timeout=timeout) as reader:
        for msg in reader.records():
            tp = (msg.topic(), msg.partition())
            n, b = seen.get(tp, (0, 0))
            seen[tp] = (n + 1, b + record_bytes(msg.key(), msg.value(), msg.headers()))
            last[tp] = msg.offset()
            if n + 1 >= sample:
                reader.finish(tp)
    estimate: dict[TP, float] = {}
    for tp, (start, end) in todo.items():
        n, b = seen.get(tp, (0, 0))
        # Offsets covered: up to the last sampled record, or the whole range if it ran out first.
        covered = (last[tp] + 1 - start) if n >= sample else (end - start)
        estimate[tp] = b / max(covered, 1)
    return estimate
