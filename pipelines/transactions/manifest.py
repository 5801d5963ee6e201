"""The manifest's records for a batch, read from Kafka: the facts of a cut from the manifest.

The relay's manifest lists every source transaction's exact spans, so a batch it covers
is cut without reading its records. Which records to read, and when to stop, is a
question of Kafka (watermarks, times, open transactions, records fetched ahead), kept
here apart from what a record says (:mod:`pipelines.transactions.manifest_records`) and
from the decision made of it (:func:`offsets.cut.decide`). A read that cannot be made
gives None: the manifest is an optimisation, and the scan and the guard still hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from connectors.preflight import group_refused
from offsets.cut import Listed, ManifestRead, RelayRanges
from offsets.ledger import TP, Intent
from pipelines.transactions import consumers as pool
from pipelines.transactions.consumers import ManifestConsumers
from pipelines.transactions.headers import topic_filter
from pipelines.transactions.manifest_records import (
    Frontier,
    proposal_limits,
    read_record,
    relay_ranges,
    topic_memo,
)
from tidemark.config import PipelineConfig

log = logging.getLogger(__name__)

#: How far before the first record of a pipeline's first batch its manifest is looked for: a
#: manifest record is produced after its events, within the transaction's timeout (broker max 15 min).
MANIFEST_LOOKBACK_MS = 15 * 60 * 1000

#: How long the manifest read waits for an open relay transaction below its high watermark.
MANIFEST_WAIT_SECONDS = 3.0


def read_manifest(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent,
                  cursor: int | None, consumers: ManifestConsumers | None = None) -> ManifestRead | None:
    """The manifest records that list transactions with events in ``intent``'s ranges, or None (no manifest).

    Reads from ``cursor`` (the previous batch's next cursor; for a first batch, or after a
    batch the scan revised, from the records a little older than the ranges' first records)
    until it has passed the high watermark seen at the start, or every relay it met has
    passed the end of every partition the ranges read (:class:`Frontier`), or an open relay
    transaction holds it for :data:`MANIFEST_WAIT_SECONDS`. Stopping early costs nothing
    in correctness: the batch's write rejects any multi-event transaction the read did not list.
    ``consumers``: the job's, kept across its batches; without them, new ones closed after the read.
    """
    if pipeline.transactions.manifest_topic is None:
        return None
    if consumers is None:
        with ManifestConsumers(client_config) as own:
            return read_manifest(client_config, pipeline, intent, cursor, own)
    try:
        return _read_manifest(consumers, pipeline, intent, cursor)
    except BaseException:
        consumers.close()  # whatever state they are in, the next read starts from new ones
        raise


def _read_manifest(consumers: ManifestConsumers, pipeline: PipelineConfig, intent: Intent,
                   cursor: int | None) -> ManifestRead | None:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    client_config = consumers.client_config
    topic = pipeline.transactions.manifest_topic
    assert topic is not None
    probe = consumers.get("read_uncommitted")
    try:
        metadata = probe.list_topics(topic, timeout=15).topics.get(topic)
        if metadata is None or metadata.error is not None or len(metadata.partitions) != 1:
            return None
        low, high = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=15, cached=False)
        if cursor is None or cursor < low:
            cursor = _first_manifest_offset(probe, topic, intent, int(low), int(high))
    except KafkaException:
        consumers.close()
        return None  # the manifest is an optimisation: the scan and the guard still hold
    starts = {r.tp: r.start for r in intent.ranges}
    ends = {r.tp: r.end for r in intent.ranges}
    limits = proposal_limits(intent)
    mine = topic_memo(topic_filter(pipeline))
    listed: list[Listed] = []
    by_relay: dict[str, list[str]] = {}
    records: list[tuple[int, tuple[tuple[TP, int], ...]]] = []
    frontier = Frontier(intent)
    position = cursor
    reader = consumers.get("read_committed")
    reader.assign([TopicPartition(topic, 0, cursor)])
    try:
        progress = time.monotonic()
        while position < high:
            # One record at a time: a batch asks for a few records, and consume(n) would wait
            # out its whole timeout for n that do not exist (0.1 s of every small batch's plan).
            m = reader.poll(0.1)
            if m is not None and m.error() is not None:
                refused = group_refused(m.error(), client_config)
                if refused is not None:
                    raise refused  # a missing ACL, not a manifest to do without
                if m.error().code() != KafkaError._PARTITION_EOF:
                    consumers.close()
                    return None
            elif m is not None and m.offset() >= cursor:  # (below: fetched for an earlier read)
                relay, found, ids, lasts = read_record(m, limits, mine, starts, ends)
                listed += found
                by_relay.setdefault(relay, []).extend(ids)
                records.append((m.offset(), lasts))
                if relay:
                    frontier.see(relay, lasts)
            now = reader.position([TopicPartition(topic, 0)])[0].offset
            if now > position:
                position, progress = now, time.monotonic()
            if frontier.reached():
                break
            if time.monotonic() - progress > MANIFEST_WAIT_SECONDS:
                break
    finally:
        if consumers.holds(reader):
            reader.unassign()  # nothing fetched ahead until the next read
    return ManifestRead(cursor, max(position, cursor), tuple(listed), relay_ranges(by_relay), tuple(records))


def _first_manifest_offset(probe: Any, topic: str, intent: Intent, low: int, high: int) -> int:
    """Where a pipeline's first manifest read starts: records a little older than its ranges' first records."""
    from confluent_kafka import TopicPartition

    stamps = _first_stamps(probe, [TopicPartition(r.topic, r.partition, r.start) for r in intent.ranges if r.span])
    if not stamps:
        return high
    found = probe.offsets_for_times([TopicPartition(topic, 0, max(0, min(stamps) - MANIFEST_LOOKBACK_MS))],
                                    timeout=15)
    offset = found[0].offset
    return low if offset < 0 and offset != -1 else (high if offset < 0 else max(low, offset))


#: How long :func:`_first_stamps` waits for the first records before guessing without the rest.
FIRST_STAMPS_SECONDS = 15.0


def _first_stamps(consumer: Any, starts: list[Any]) -> list[int]:
    """The timestamps of the records at ``starts`` (or the first ones after), one per partition.

    Read with the manifest's ``read_uncommitted`` consumer, which fetches nothing else: a new
    consumer's start would be half of a first batch's manifest read. A
    partition that answers with an error or not in time gives nothing: the start is only a
    guess, and the batch's guard holds whatever it misses.
    """
    from confluent_kafka import KafkaError

    stamps: list[int] = []
    waiting = {(tp.topic, tp.partition) for tp in starts}
    consumer.assign(starts)
    try:
        deadline = time.monotonic() + FIRST_STAMPS_SECONDS
        while waiting and time.monotonic() < deadline:
            m = consumer.poll(0.1)
            if m is None or (m.topic(), m.partition()) not in waiting:
                continue
            waiting.discard((m.topic(), m.partition()))
            if m.error() is None:
                stamps.append(m.timestamp()[1])
            elif m.error().code() != KafkaError._PARTITION_EOF:
                log.debug("no first record of %s[%s] for the manifest's start: %s", m.topic(), m.partition(),
                          m.error())
    finally:
        consumer.unassign()
    return stamps


def listed_ranges(client_config: Mapping[str, str], pipeline: PipelineConfig, intent: Intent) -> RelayRanges:
    """What the manifest listed for ``intent``'s ranges, read again from exactly the records its
    plan read (a replay's guard). Records lost since: less listed, so the guard may reject the
    batch, which is then planned with the scan: slower, never wrong."""
    from confluent_kafka import KafkaError, TopicPartition

    if intent.manifest is None or pipeline.transactions.manifest_topic is None:
        return ()
    start, end, _ = intent.manifest
    topic = pipeline.transactions.manifest_topic
    starts = {r.tp: r.start for r in intent.ranges}
    ends = {r.tp: r.end for r in intent.ranges}
    limits = proposal_limits(intent)
    mine = topic_memo(topic_filter(pipeline))
    by_relay: dict[str, list[str]] = {}
    reader = pool.manifest_consumer(client_config, "read_committed")
    try:
        reader.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in reader.consume(num_messages=500, timeout=0.1):
                if m.error() is None and m.offset() < end:
                    relay, _, ids, _ = read_record(m, limits, mine, starts, ends)
                    if relay:
                        by_relay.setdefault(relay, []).extend(ids)
                elif m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF:
                    return relay_ranges(by_relay)
            if reader.position([TopicPartition(topic, 0)])[0].offset >= end:
                break
    finally:
        reader.close()
    return relay_ranges(by_relay)
