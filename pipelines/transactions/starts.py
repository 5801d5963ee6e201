"""Where a pipeline's first batch starts, moved so that no source transaction lies across it.

A pipeline's first starts (``start: latest`` or a timestamp) are taken per partition,
and can fall between the events of one source transaction; the part below them would
never be read, and G3 would hold the rest until its timeout before releasing it torn.
This is the one decision about offsets made before the ledger holds anything, so it is
apart from the cut of every later batch: it reads a window around the starts and moves
them back (:func:`whole_starts`; the moving itself is pure, :func:`pulled_back`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from connectors.admin import PartitionBounds
from offsets.ledger import TP
from pipelines.transactions.headers import Shared, topic_filter, txn_of
from tidemark.config import PipelineConfig

log = logging.getLogger(__name__)


#: Offsets read on each side of a pipeline's first starts for source transactions they would split.
STRADDLE_WINDOW = 5_000


def whole_starts(client_config: Mapping[str, str], pipeline: PipelineConfig, starts: Mapping[TP, int],
                 bounds: Mapping[TP, PartitionBounds], window: int = STRADDLE_WINDOW) -> dict[TP, int]:
    """A pipeline's first starts (``start: latest`` or a timestamp), moved back so that no source
    transaction has events on both sides of them.

    Starts taken per partition split a transaction that lies across them: a Kafka
    transaction's commit markers reach its partitions one by one, so a snapshot of LSOs can
    fall after its events in one partition and before them in another; and a timestamp
    falls between a transaction's events in different partitions. The part below the
    starts would never be read, and G3 would hold the rest for
    ``transactions.incomplete_timeout_seconds`` before releasing it torn. So the ``window``
    offsets above each start (open transactions' too: read uncommitted, up to the high
    watermark) name the transactions there, and the ``window`` offsets below each start
    (committed) show which of them started earlier; each such start moves back to the
    transaction's first event (:func:`pulled_back`). Nothing is written before the first
    batch records the starts, so moving them is free.
    """
    from connectors.admin import KafkaAdmin
    from connectors.range_reader import RangeReader

    with KafkaAdmin(client_config, isolation="read_uncommitted") as admin:
        high = {tp: b.stable_end for tp, b in admin.bounds(starts).items()}  # high watermarks, here
    mine = topic_filter(pipeline)
    memo: dict[tuple[bytes | None, ...], Shared | None] = {}

    def events(ranges: list[tuple[str, int, int, int]], isolation: str) -> Iterator[tuple[str, TP, int]]:
        with RangeReader(client_config, ranges, isolation=isolation, fetch_bytes=16 * 1024 * 1024,
                         partition_fetch_bytes=1024 * 1024) as reader:
            for m in reader.records():
                headers = m.headers()
                event = txn_of(headers, mine, memo) if headers else None
                if event is not None and event[2] > 1:
                    yield event[0], (m.topic(), m.partition()), m.offset()

    above = {txn for txn, _, _ in events([(t, p, s, min(s + window, high.get((t, p), s)))
                                          for (t, p), s in starts.items()], "read_uncommitted")}
    if not above:
        return dict(starts)
    floors = {tp: max(bounds[tp].log_start, s - window) for tp, s in starts.items()}
    below = list(events([(t, p, floors[(t, p)], s) for (t, p), s in starts.items()], "read_committed"))
    moved = pulled_back(starts, above, below)
    for tp in sorted(tp for tp in moved if moved[tp] != starts[tp]):
        log.info("pipeline %s: first start of %s[%d] moved back from %d to %d, to the first event of a source "
                 "transaction that lies across the starts", pipeline.name, tp[0], tp[1], starts[tp], moved[tp])
        if moved[tp] == floors[tp] and floors[tp] > bounds[tp].log_start:
            log.warning("pipeline %s: a source transaction in %s[%d] may reach below the %d records searched; "
                        "if so G3 holds it for transactions.incomplete_timeout_seconds", pipeline.name, *tp, window)
    return moved


def pulled_back(starts: Mapping[TP, int], above: set[str], below: list[tuple[str, TP, int]]) -> dict[TP, int]:
    """``starts`` moved back over every transaction in ``above`` (met at or past the starts) with
    events in ``below`` ((id, partition, offset) under the starts), and then over every
    transaction with an event in a stretch so added (it is now read, so the rest of it must be)."""
    first: dict[str, dict[TP, int]] = {}
    at: dict[TP, list[tuple[int, str]]] = {}
    for txn, tp, offset in below:
        mins = first.setdefault(txn, {})
        mins[tp] = min(offset, mins.get(tp, offset))
        at.setdefault(tp, []).append((offset, txn))
    moved = dict(starts)
    todo = [txn for txn in above if txn in first]
    done: set[str] = set()
    while todo:
        txn = todo.pop()
        if txn in done:
            continue
        done.add(txn)
        for tp, offset in first[txn].items():
            if offset < moved[tp]:
                todo += [other for o, other in at[tp] if offset <= o < moved[tp] and other not in done]
                moved[tp] = offset
    return moved
