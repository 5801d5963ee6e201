"""The manifest's Kafka consumers, kept from one batch's read to the next and between runs.

Starting a consumer (threads, connections, metadata) costs more than reading a small
batch's manifest records, so the consumers outlive a read: a job keeps its pair for all
its batches, and a process keeps an idle pair for its next run with the same settings,
for less than brokers keep an idle connection. Keeping clients alive is a lifecycle of
its own (a pool, a timer, an exit hook), apart from what a read does with them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Self

from connectors.kafka_config import fingerprint

log = logging.getLogger(__name__)


def manifest_consumer(client_config: Mapping[str, str], isolation: str) -> Any:
    """A new consumer of the manifest topic, assigned nothing: ``read_uncommitted`` for
    watermarks, times and first records, ``read_committed`` for the records."""
    import uuid

    from confluent_kafka import Consumer

    # A read of known extent: at the partition's end the broker must answer at once, not after
    # fetch.wait.max.ms (500 ms by default) of waiting for more.
    settings = {**client_config, "group.id": f"tidemark-manifest-{uuid.uuid4().hex[:8]}",
                "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True,
                "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10}
    if isolation == "read_uncommitted":
        # Its one fetch (the first records of a batch's ranges) wants a record per partition, not librdkafka's
        # prefetch of up to 1 MiB each.
        # (Not `queued.min.messages`: at 1, each partition's first record came a second late.)
        settings.update({"max.partition.fetch.bytes": 64 * 1024, "fetch.max.bytes": 1 << 20})
    return Consumer(settings)


#: How long consumers a run left stay kept for a later run of this process (:meth:`ManifestConsumers.kept`):
#: below brokers' ``connections.max.idle.ms`` (10 minutes by default), which would close their connections.
KEPT_SECONDS = 120.0


class ManifestConsumers:
    """The two consumers a manifest read uses, kept for a job's batches (``--follow``, a bounded
    run of several batches) and, idle, for the process's next run with the same settings
    (:meth:`kept`): a consumer's start (threads, connections, metadata) cost more than reading
    a small batch's manifest records. Between reads nothing is assigned, so nothing is
    fetched ahead. After a failed read both are closed and the next read starts new ones."""

    _idle: ClassVar[dict[str, list[tuple[float, ManifestConsumers]]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _reaper: ClassVar[threading.Timer | None] = None

    def __init__(self, client_config: Mapping[str, str]) -> None:
        self.client_config = client_config
        self._made: dict[str, Any] = {}

    @classmethod
    @contextmanager
    def kept(cls, client_config: Mapping[str, str]) -> Iterator[ManifestConsumers]:
        """Consumers for one run: those an earlier run of this process left idle with the same
        settings (``fingerprint``: a changed credential or certificate gets new ones), else new.

        Each is one run's alone while it runs; afterwards it waits :data:`KEPT_SECONDS` for
        the next run (a served driver's next scheduled ingest, whose plan would otherwise
        spend 0.1 s starting new ones), then is closed.
        """
        key = fingerprint(dict(client_config))
        with cls._lock:
            waiting = cls._idle.get(key, [])
            consumers = waiting.pop()[1] if waiting else cls(client_config)
        try:
            yield consumers
        finally:
            with cls._lock:
                cls._idle.setdefault(key, []).append((time.monotonic(), consumers))
                if cls._reaper is None:
                    cls._reap_later()

    @classmethod
    def _reap_later(cls) -> None:
        """One timer for all kept consumers: in :data:`KEPT_SECONDS`, close the expired, and
        wait again while any are kept. (Called holding the lock.)"""
        def reap() -> None:
            cls.close_idle(older_than=KEPT_SECONDS)
            with cls._lock:
                if cls._reaper is timer:  # (not cancelled and replaced meanwhile)
                    cls._reaper = None
                    if cls._idle:
                        cls._reap_later()

        timer = cls._reaper = threading.Timer(KEPT_SECONDS, reap)
        timer.daemon = True
        timer.start()

    @classmethod
    def close_idle(cls, older_than: float = 0.0) -> int:
        """Close the kept consumers idle for at least ``older_than`` seconds; how many sets were closed."""
        now = time.monotonic()
        with cls._lock:
            stale = [c for sets in cls._idle.values() for at, c in sets if now - at >= older_than]
            for key in list(cls._idle):
                cls._idle[key] = [(at, c) for at, c in cls._idle[key] if now - at < older_than]
                if not cls._idle[key]:
                    del cls._idle[key]
            if not cls._idle and cls._reaper is not None:
                cls._reaper.cancel()  # nothing left to wait for
                cls._reaper = None
        for consumers in stale:
            consumers.close()
        return len(stale)

    def get(self, isolation: str) -> Any:
        """The ``read_uncommitted`` (watermarks, times, first records) or ``read_committed`` (records) consumer."""
        consumer = self._made.get(isolation)
        if consumer is None:
            consumer = self._made[isolation] = manifest_consumer(self.client_config, isolation)
        return consumer

    def holds(self, consumer: Any) -> bool:
        return any(made is consumer for made in self._made.values())

    def close(self) -> None:
        made, self._made = self._made, {}
        for consumer in made.values():
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - closing what failed: the next read starts anew
                log.debug("closing a manifest consumer: %s", exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


atexit.register(ManifestConsumers.close_idle)
