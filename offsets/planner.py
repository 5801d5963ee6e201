"""Plan the next batch's offset ranges: pure logic, no I/O.

Given where the last batch ended, what partitions exist now with their log-start offset
and LSO, and where new partitions start, return one ``[start, end)`` per partition with
``end <= LSO`` (never past what read_committed readers can see, or Spark's reader waits),
sharing the record cap fairly among partitions that have something to read. With a byte
cap, each partition's share is also sized by an estimate of its bytes per offset
(``connectors.sizes``) so that the batch stays within both caps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from connectors.admin import PartitionBounds, check_retention
from offsets.ledger import TP, OffsetRegressionError, Range


def plan_ranges(
    previous_ends: Mapping[TP, int],
    bounds: Mapping[TP, PartitionBounds],
    new_partition_starts: Mapping[TP, int],
    max_offsets: int,
    *,
    max_bytes: int | None = None,
    bytes_per_offset: Mapping[TP, float] | None = None,
) -> tuple[Range, ...]:
    """Ranges for the next batch; every partition in ``bounds`` gets one (possibly empty).

    With ``max_bytes``, the estimated bytes of the batch stay within it, except that a
    batch always moves at least one offset: a record larger than the cap goes alone.
    A partition without an estimate weighs nothing (its offsets count only against
    ``max_offsets``).
    """
    starts: dict[TP, int] = {}
    for tp in bounds:
        if tp in previous_ends:
            starts[tp] = previous_ends[tp]
        elif tp in new_partition_starts:
            starts[tp] = new_partition_starts[tp]
        else:
            raise ValueError(f"no start offset for new partition {tp}")
    vanished = sorted(set(previous_ends) - set(bounds))
    if vanished:
        raise OffsetRegressionError(
            f"partitions we have read from no longer exist: {vanished}; was a topic deleted? "
            "Tidemark will not guess; restore the topic or start a new pipeline")
    for tp, start in starts.items():
        if start > bounds[tp].stable_end:
            raise OffsetRegressionError(
                f"{tp[0]}[{tp[1]}]: stored offset {start} is past the partition's end {bounds[tp].stable_end}; "
                "was the topic deleted and recreated? To read it from its start under this pipeline: "
                "`tidemark offsets seek PIPELINE --to earliest` (docs/runbooks.md, 'Recovery')")
    check_retention({tp: s for tp, s in starts.items() if s < bounds[tp].stable_end}, bounds)

    lag = {tp: bounds[tp].stable_end - s for tp, s in starts.items()}
    grant = _fair_share(lag, max_offsets)
    if max_bytes is not None:
        grant = _within_bytes(grant, bytes_per_offset or {}, max_bytes)
    return tuple(sorted(Range(tp[0], tp[1], starts[tp], starts[tp] + grant[tp]) for tp in starts))


def _fair_share(lag: Mapping[TP, int], budget: int) -> dict[TP, int]:
    """Water-filling: each partition gets min(its lag, an equal share of what is left)."""
    grant = {tp: 0 for tp in lag}
    pending = sorted((tp for tp in lag if lag[tp] > 0), key=lambda tp: (lag[tp], tp))
    left = budget
    while pending and left > 0:
        share = max(1, left // len(pending))
        tp = pending[0]
        take = min(lag[tp], share, left)
        grant[tp] = take
        left -= take
        pending.pop(0)
    return grant


def _within_bytes(grant: Mapping[TP, int], weight: Mapping[TP, float], budget: int) -> dict[TP, int]:
    """``grant`` cut so that the estimated bytes fit ``budget``, shared fairly in bytes."""
    free = {tp: n for tp, n in grant.items() if weight.get(tp, 0.0) <= 0}
    heavy = {tp: math.ceil(n * weight[tp]) for tp, n in grant.items() if tp not in free}
    byte_grant = _fair_share(heavy, budget)
    out = dict(free)
    for tp, b in byte_grant.items():
        out[tp] = min(grant[tp], int(b // weight[tp]))
    if not any(out.values()) and any(grant.values()):
        # Not one whole record fits: the heaviest-granted partition moves by one, alone.
        first = max((tp for tp in byte_grant if grant[tp] > 0), key=lambda tp: (byte_grant[tp], tp))
        out[first] = 1
    return out
