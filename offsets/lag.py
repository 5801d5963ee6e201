"""Per-partition lag of a pipeline: its next offset against Kafka's last stable offset.

Shared by ``tidemark offsets show``, ``tidemark status`` and the orchestration run
reports, so the three never disagree on what "lag" means: LSO minus the pipeline's next
offset, counted in offsets (control markers and aborted records included, since only
reading the range can tell them apart). A partition the pipeline has not read yet lags
by everything from the log start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connectors.admin import KafkaAdmin
from tidemark.config import PipelineConfig

TP = tuple[str, int]


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    next_offset: int | None
    """The first offset the pipeline has not committed; None if it never read the partition."""
    lso: int
    lag: int


def partition_lags(client_config: Mapping[str, Any], pipeline: PipelineConfig,
                   committed: Mapping[TP, int], *, timeout: float = 15.0) -> list[PartitionLag]:
    """``timeout`` bounds each request to Kafka (a metrics scrape must answer within its own)."""
    with KafkaAdmin(dict(client_config), timeout=timeout) as admin:
        bounds = admin.bounds(admin.partitions_matching(pipeline.topics, pipeline.topic_pattern))
    lags = []
    for (topic, part), b in sorted(bounds.items()):
        done = committed.get((topic, part))
        lag = b.stable_end - (done if done is not None else b.log_start)
        lags.append(PartitionLag(topic, part, done, b.stable_end, lag))
    return lags
