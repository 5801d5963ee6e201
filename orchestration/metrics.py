"""Prometheus metrics for `ingest --follow`, `relay run` and `serve` (``--metrics-port``).

Two kinds of values, and where each comes from:

* **What the work did** (batches, rows, events, Kafka transactions, outages) is counted
  by the work itself, as counters: a scrape never triggers it, and ``rate()`` turns a
  counter into a throughput without the process choosing a window.
* **How things stand** (each partition's committed offset, LSO and lag; the relay's
  backlog; the last audit's verdict) is read when Prometheus scrapes, from the same
  places ``tidemark status`` reads (the ledger through delta-rs, Kafka's LSO, the outbox
  table), so a scrape says how things are now, even if the process is stuck. A part
  that cannot be read is left out of that scrape and counted in
  ``tidemark_scrape_errors_total``, never an error page.

Names follow Prometheus conventions: a ``tidemark_`` prefix, base units in the name
(``_seconds``, ``_offsets``), ``_total`` on counters, and labels only for bounded sets
(pipeline, topic, partition, relay). The list, with example alerts, is in
docs/running.md ("Metrics").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from offsets.frames import BatchResult
    from outbox.relay import Relay
    from tidemark.config import PipelineConfig, RelayConfig

log = logging.getLogger(__name__)

#: Batch durations span a follower's sub-second batches to a backfill's minutes.
DURATION_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class Metrics:
    """One process's registry: the counters its work increments, and the collectors read at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scrape_errors = Counter("tidemark_scrape_errors", "Parts of a scrape that could not be read "
                                     "(Kafka, the ledger or PostgreSQL unavailable)", ["part"], registry=r)
        self.batches = Counter("tidemark_batches", "Batches committed to the target (replays included)",
                               ["pipeline"], registry=r)
        self.rows = Counter("tidemark_batch_rows", "Rows appended to the target", ["pipeline"], registry=r)
        self.quarantined = Counter("tidemark_quarantined_rows", "Records appended to the quarantine table",
                                   ["pipeline"], registry=r)
        self.offsets = Counter("tidemark_batch_offsets", "Kafka offsets the committed batches cover (records, "
                               "transaction markers and aborted records)", ["pipeline"], registry=r)
        self.released = Counter("tidemark_g3_released_transactions", "Source transactions written incomplete "
                                "after transactions.incomplete_timeout_seconds (G3's policy)", ["pipeline"],
                                registry=r)
        self.duration = Histogram("tidemark_batch_duration_seconds", "Time to plan, write and commit one batch",
                                  ["pipeline"], buckets=DURATION_BUCKETS, registry=r)
        self.last_batch = Gauge("tidemark_last_batch_timestamp_seconds", "When this process last committed a "
                                "batch (Unix time)", ["pipeline"], registry=r)
        self.kafka_outages = Counter("tidemark_ingest_kafka_outages", "Times a follower found Kafka not answering "
                                     "and waited for it", ["pipeline"], registry=r)
        self.kafka_down = Gauge("tidemark_ingest_kafka_down", "1 while a follower waits for Kafka to answer again",
                                ["pipeline"], registry=r)

        self.stalled = Gauge("tidemark_ingest_stalled_seconds", "Seconds a follower has moved no offset while its "
                             "partitions held data past its ends (0 while it moves or has nothing to read)",
                             ["pipeline"], registry=r)

    def count_batches(self, pipeline: str) -> None:
        """Show ``pipeline``'s batch counters at 0 from the start (a series that appears only at its first
        increment hides that first increase from ``rate()``)."""
        for counter in (self.batches, self.rows, self.quarantined, self.offsets, self.released, self.kafka_outages):
            counter.labels(pipeline)
        self.kafka_down.labels(pipeline).set(0)
        self.stalled.labels(pipeline).set(0)
        self.duration.labels(pipeline)

    def kafka_outage(self, pipeline: str, down: bool) -> None:
        """A follower's wait for Kafka began (``down``) or ended (``IngestJob``'s ``on_outage``)."""
        if down:
            self.kafka_outages.labels(pipeline).inc()
        self.kafka_down.labels(pipeline).set(1 if down else 0)

    def batch(self, pipeline: str, result: BatchResult, seconds: float) -> None:
        """Count one committed batch (``IngestJob``'s ``on_batch``)."""
        self.batches.labels(pipeline).inc()
        self.rows.labels(pipeline).inc(result.rows)
        self.quarantined.labels(pipeline).inc(result.quarantined)
        self.offsets.labels(pipeline).inc(sum(r.span for r in result.intent.ranges))
        self.released.labels(pipeline).inc(len(result.intent.released))
        self.duration.labels(pipeline).observe(seconds)
        self.last_batch.labels(pipeline).set(time.time())

    def watch_pipelines(self, pipelines: Iterable[PipelineConfig], client_config: Mapping[str, Any],
                        quality_dir: Path) -> None:
        self.registry.register(_PipelineCollector(list(pipelines), dict(client_config), quality_dir,
                                                  self.scrape_errors))

    def watch_relay(self, relay: RelayConfig, dsn: str, live: Relay | None = None) -> None:
        """The relay's backlog at scrape time, and with ``live`` (the relay of this process) its counters."""
        self.registry.register(_RelayCollector(relay, dsn, live, self.scrape_errors))

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` on ``host:port`` from a daemon thread (ends with the process)."""
        start_http_server(port, addr=host, registry=self.registry)
        log.warning("metrics on http://%s:%d/metrics", host, port)


#: How long a scrape waits for each Kafka request: Prometheus gives a scrape 10 s by default,
#: and a scrape while Kafka is down must still answer (with what it can read, and the error counted).
SCRAPE_KAFKA_SECONDS = 2.0


class _PipelineCollector(Collector):
    """Per pipeline and partition: committed offset, LSO, lag; the last audit's verdict."""

    def __init__(self, pipelines: list[PipelineConfig], client_config: dict[str, Any], quality_dir: Path,
                 errors: Counter) -> None:
        self.pipelines = pipelines
        self.client_config = client_config
        self.quality_dir = quality_dir
        self.errors = errors

    def collect(self) -> Iterator[Metric]:
        from offsets.lag import partition_lags
        from offsets.ledger import read_last
        from quality.audit import last_verdict

        labels = ["pipeline", "topic", "partition"]
        committed = GaugeMetricFamily("tidemark_partition_committed_offset", "The next offset the pipeline has "
                                      "not committed (the ledger's newest batch); absent before its first batch",
                                      labels=labels)
        lso = GaugeMetricFamily("tidemark_partition_lso_offset", "Kafka's last stable offset", labels=labels)
        lag = GaugeMetricFamily("tidemark_partition_lag_offsets", "LSO minus the committed offset (from the log "
                                "start for a partition never read)", labels=labels)
        passed = GaugeMetricFamily("tidemark_audit_passed", "1 if the last audit passed, 0 if it failed; absent "
                                   "before the first audit", labels=["pipeline"])
        audited = GaugeMetricFamily("tidemark_audit_timestamp_seconds", "When the last audit ran (Unix time)",
                                    labels=["pipeline"])
        for p in self.pipelines:
            try:
                last = read_last(p.ledger_path, p.name)
                for x in partition_lags(self.client_config, p, last.ends() if last else {},
                                        timeout=SCRAPE_KAFKA_SECONDS):
                    key = [p.name, x.topic, str(x.partition)]
                    if x.next_offset is not None:
                        committed.add_metric(key, x.next_offset)
                    lso.add_metric(key, x.lso)
                    lag.add_metric(key, x.lag)
            except Exception as exc:  # noqa: BLE001 - a scrape reports what it can read
                log.debug("metrics: pipeline %s unreadable: %s", p.name, exc)
                self.errors.labels(f"pipeline:{p.name}").inc()
            verdict = last_verdict(self.quality_dir, p.name)
            if verdict is not None:
                passed.add_metric([p.name], 1.0 if verdict["passed"] else 0.0)
                audited.add_metric([p.name], datetime.fromisoformat(verdict["at"]).timestamp())
        yield from (committed, lso, lag, passed, audited)


#: The relay's report fields exposed as counters: (report attribute, metric name, help).
_RELAY_COUNTERS = (
    ("events", "tidemark_relay_events", "Events relayed into Kafka"),
    ("transactions", "tidemark_relay_source_transactions", "Source transactions relayed"),
    ("kafka_transactions", "tidemark_relay_kafka_transactions", "Kafka transactions committed (groups)"),
    ("skipped", "tidemark_relay_redelivered_skipped", ("Source transactions the slot redelivered that were "
     "already in Kafka")),
    ("dead_lettered", "tidemark_relay_dead_lettered_transactions", "Source transactions moved to the dead letters"),
    ("redone", "tidemark_relay_redone_groups", "Groups relayed again after an abort or an unknown commit outcome"),
    ("outages", "tidemark_relay_outages", "Times Kafka was unavailable and the relay stepped back"),
    ("registry_outages", "tidemark_relay_registry_outages", ("Times the schema registry did not answer a lookup "
     "the relay needed and it waited")),
)


class _RelayCollector(Collector):
    def __init__(self, relay: RelayConfig, dsn: str, live: Relay | None, errors: Counter) -> None:
        self.relay = relay
        self.dsn = dsn
        self.live = live
        self.errors = errors

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        from outbox.status import relay_backlog

        rid = [self.relay.id]
        if self.live is not None:
            report = self.live.report
            for attr, name, text in _RELAY_COUNTERS:
                family = CounterMetricFamily(name, text, labels=["relay"])
                family.add_metric(rid, getattr(report, attr))
                yield family
            down = GaugeMetricFamily("tidemark_relay_registry_down", "1 while the relay waits for the schema "
                                     "registry to answer a lookup it needs", labels=["relay"])
            down.add_metric(rid, 1.0 if report.registry_down else 0.0)
            yield down
            if self.live.position is not None:
                position = GaugeMetricFamily("tidemark_relay_position_lsn", "The end LSN of the last source "
                                             "transaction in Kafka (the relay's position)", labels=["relay"])
                position.add_metric(rid, self.live.position.end_lsn)
                yield position
        try:
            events, seconds = relay_backlog(self.relay, self.dsn)
        except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: this scrape has no backlog
            log.debug("metrics: relay backlog unreadable: %s", exc)
            self.errors.labels("relay").inc()
            return
        lag = GaugeMetricFamily("tidemark_relay_lag_events", "Outbox rows not yet relayed and acknowledged",
                                labels=["relay"])
        lag.add_metric(rid, events)
        age = GaugeMetricFamily("tidemark_relay_lag_seconds", "Age of the oldest outbox row not yet relayed and "
                                "acknowledged (0 when none)", labels=["relay"])
        age.add_metric(rid, seconds)
        yield from (lag, age)


def never_raising(on_batch: Callable[[BatchResult, float], None]) -> Callable[[BatchResult, float], None]:
    """``on_batch`` with its own failures logged, never raised into the batch loop."""
    def call(result: BatchResult, seconds: float) -> None:
        try:
            on_batch(result, seconds)
        except Exception:  # metrics must not stop ingestion
            log.exception("metrics: recording a batch failed")
    return call
