"""A PySpark Python Data Source that reads exact Kafka offset ranges with confluent-kafka.

Benchmark candidate, not (yet) used by the pipelines: ``bench/diagnostics/reader_bench.py`` compares it
with Spark's built-in ``kafka`` source as ``pipelines.transform.read_ranges`` uses it.

Usage::

    spark.dataSource.register(TidemarkKafkaDataSource)
    df = (spark.read.format("tidemark_kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("ranges", json.dumps([{"topic": "t", "partition": 0, "start": 0, "end": 100}]))
          .option("includeHeaders", "true")
          .load())

Semantics, chosen to give the same rows as Spark's source:

* one Spark input partition per Kafka range ``[start, end)``; empty ranges are dropped;
* ``isolation.level=read_committed`` always (an option cannot turn it off), no group
  membership (``assign`` only) and no offset commits;
* a range is finished when the consumer reaches ``end``: the record at ``end - 1``, a record
  past ``end``, a partition-EOF event at or past ``end``, or ``position() >= end`` (read_committed
  never delivers markers and aborted records, but librdkafka moves the position past them).
  ``enable.partition.eof`` is on and the position is checked after every empty 50 ms poll, so
  a range that ends with, or is made only of, markers/aborted records ends within a fetch
  round-trip instead of waiting for a timeout (librdkafka's EOF event alone comes only after
  an empty fetch, i.e. ``fetch.wait.max.ms`` = 500 ms later);
* a start below the log-start offset fails (``auto.offset.reset=error``), like Spark's
  ``failOnDataLoss=true``; no progress for ``pollTimeoutMs`` fails too, never a short read;
* columns and types are those of Spark's source: ``key, value, topic, partition, offset,
  timestamp, timestampType`` (+ ``headers`` with ``includeHeaders``); ``timestampType`` uses
  the Java client's ids (0 CreateTime, 1 LogAppendTime, -1 none), ``headers`` is null for a
  record without headers;
* rows leave the Python worker as pyarrow ``RecordBatch``es of ``maxBatchRows`` rows.

Options: ``kafka.<librdkafka property>`` (passed to the consumer with the prefix removed;
``kafka.bootstrap.servers`` is required), ``ranges`` (JSON list of objects with ``topic``,
``partition``, ``start``, ``end``), ``includeHeaders`` (default false), ``pollTimeoutMs``
(default 120000, Spark's default), ``maxBatchRows`` (default 10000).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

BASE_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
               "timestampType INT")
HEADERS_FIELD = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"

# Options the reader owns: a caller cannot weaken them through ``kafka.*``.
_FORCED = {
    "isolation.level": "read_committed",
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "enable.partition.eof": "true",
    "auto.offset.reset": "error",
}


def _flag(value: str | None, default: bool = False) -> bool:
    return default if value is None else value.strip().lower() in ("true", "1", "yes")


class KafkaRangePartition(InputPartition):
    """One Kafka range ``[start, end)``; picklable, sent to a Python worker."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__(f"{topic}:{partition}:{start}-{end}")
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class RangeReadTimeout(RuntimeError):
    """The consumer made no progress towards ``end`` for ``pollTimeoutMs``."""


class TidemarkKafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidemark_kafka"

    def schema(self) -> str:
        if _flag(self.options.get("includeHeaders")):
            return f"{BASE_SCHEMA}, {HEADERS_FIELD}"
        return BASE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidemarkKafkaReader(dict(self.options.items()), schema)


class TidemarkKafkaReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        lower = {k.lower(): v for k, v in options.items()}
        self.schema = schema
        self.include_headers = _flag(lower.get("includeheaders"))
        self.poll_timeout = float(lower.get("polltimeoutms", "120000")) / 1000.0
        self.max_batch_rows = int(lower.get("maxbatchrows", "10000"))
        if "ranges" not in lower:
            raise ValueError("option 'ranges' (JSON list of {topic, partition, start, end}) is required")
        self.ranges = [KafkaRangePartition(str(r["topic"]), int(r["partition"]), int(r["start"]), int(r["end"]))
                       for r in json.loads(lower["ranges"])]
        for r in self.ranges:
            if r.start < 0 or r.end < r.start:
                raise ValueError(f"bad range {r.value}: need 0 <= start <= end")
        client = {k[len("kafka."):]: v for k, v in lower.items() if k.startswith("kafka.")}
        if "bootstrap.servers" not in client:
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        self.client_config = {**client, **_FORCED}

    def partitions(self) -> list[InputPartition]:
        return [r for r in self.ranges if r.end > r.start]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRangePartition)
        return _read_range(partition, self.client_config, self.schema, include_headers=self.include_headers,
                           poll_timeout=self.poll_timeout, max_batch_rows=self.max_batch_rows)


def _arrow_schema(schema: StructType) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    # The same conversion the Python worker applies to tuples (UTC timestamps, small binary).
    return to_arrow_schema(schema)


def _read_range(r: KafkaRangePartition, client_config: dict[str, str], schema: StructType, *,
                include_headers: bool, poll_timeout: float, max_batch_rows: int) -> Iterator[Any]:
    import time

    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    pa_schema = _arrow_schema(schema)
    config: dict[str, Any] = {"group.id": f"tidemark-pyds-{uuid.uuid4().hex[:12]}", **client_config}
    consumer = Consumer(config)
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    stamps: list[int] = []
    stamp_types: list[int] = []
    headers: list[list[dict[str, Any]] | None] = []

    def batch() -> Any:
        n = len(offsets)
        columns = [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([r.topic] * n, pa.string()),
            pa.array([r.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.int64()).cast(pa_schema.field("timestamp").type),
            pa.array(stamp_types, pa.int32()),
        ]
        if include_headers:
            columns.append(pa.array(headers, pa_schema.field("headers").type))
        out = pa.RecordBatch.from_arrays(columns, schema=pa_schema)
        for column in (keys, values, offsets, stamps, stamp_types, headers):
            column.clear()
        return out

    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        done = False
        last_progress = time.monotonic()
        reached = r.start  # first offset not known to be consumed or skipped
        while not done:
            # Drain what is queued without waiting (consume() with a timeout waits for the whole
            # timeout unless num_messages arrive: 0.5 s per call at a range's end), then block
            # in poll(), which returns as soon as one record or event arrives.
            messages = consumer.consume(num_messages=max(1, min(max_batch_rows, 10_000)), timeout=0)
            if not messages:
                one = consumer.poll(0.05)
                messages = [one] if one is not None else []
            delivered = False
            for m in cast(list[Any], messages):  # the stubs type offset() as int | None
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # EOF at the LSO: every offset below m.offset() was delivered or skipped.
                        if m.offset() >= r.end:
                            done = True
                            break
                        continue
                    raise KafkaException(err)
                off = m.offset()
                if off >= r.end:
                    done = True
                    break
                delivered = True
                keys.append(m.key())
                values.append(m.value())
                offsets.append(off)
                ts_type, ts_ms = m.timestamp()
                stamps.append(ts_ms * 1000)  # ms -> us, as Spark does; -1 stays "not available"
                stamp_types.append(ts_type - 1)  # librdkafka 0/1/2 -> Java -1/0/1
                if include_headers:
                    h = m.headers()
                    headers.append([{"key": k, "value": v} for k, v in h] if h else None)
                reached = off + 1
                if reached >= r.end:
                    done = True
                    break
            if done:
                break
            if delivered:
                last_progress = time.monotonic()
            else:
                # No record: skipped aborted records and markers may still have moved the position.
                pos = consumer.position([TopicPartition(r.topic, r.partition)])[0].offset
                if pos >= r.end:
                    break
                if pos > reached:
                    reached = pos
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > poll_timeout:
                    raise RangeReadTimeout(
                        f"no progress reading {r.value} for {poll_timeout:.0f}s (at offset {reached}, "
                        f"position {pos}); is `end` past the partition's last stable offset?")
            if len(offsets) >= max_batch_rows:
                yield batch()
        if offsets:
            yield batch()
    finally:
        consumer.close()
