"""Ingest on real Kafka, Spark and Delta: exactly the read_committed records, once each."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from offsets.ledger import Ledger
from offsets.protocol import ConcurrentWriterError
from offsets.tables import delta_table_exists
from pipelines import transform
from pipelines.ingest import IngestJob
from tests.kafka_helpers import read_all, transactional_producer, write_transaction
from tidemark.config import parse_config
from tidemark.errors import ConfigError


def _config(topic: str, tmp: Path, **extra: object):  # type: ignore[no-untyped-def]
    pipeline = {"name": "orders", "topics": [topic], "target": str(tmp / "orders"),
                "schema": "id INT, note STRING", **extra}
    return parse_config({"pipelines": [pipeline]})


def _json(i: int, tag: str) -> bytes:
    return json.dumps({"id": i, "note": tag}).encode()


def _table_keys(spark, path: str) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("delta").load(path).select("_kafka_topic", "_kafka_partition", "_kafka_offset").collect()
    return sorted((r[0], r[1], r[2]) for r in rows)


def _kafka_keys(bootstrap: str, topic: str) -> list[tuple[str, int, int]]:
    return sorted((topic, r.partition, r.offset) for r in read_all(bootstrap, topic))


def test_ingest_is_exactly_once_across_runs(spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("ingest", partitions=3)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(6):
        write_transaction(producer, topic, [_json(t * 10 + i, f"t{t}") for i in range(10)], commit=t % 3 != 1)
    config = _config(topic, tmp_path, max_records_per_batch=25)
    pipeline = config.pipelines[0]

    first = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert len(first.batches) >= 2  # the cap split the work
    assert _table_keys(spark, pipeline.target) == _kafka_keys(kafka_bootstrap, topic)
    assert first.rows == 40

    again = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert again.batches == []  # nothing new: no batch, no commit

    write_transaction(producer, topic, [_json(900 + i, "late") for i in range(7)], commit=True)
    write_transaction(producer, topic, [_json(950 + i, "aborted") for i in range(7)], commit=False)
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    keys = _table_keys(spark, pipeline.target)
    assert keys == _kafka_keys(kafka_bootstrap, topic) and len(keys) == 47
    notes = {r.note for r in spark.read.format("delta").load(pipeline.target).select("note").collect()}
    assert "aborted" not in notes and "t1" not in notes and "late" in notes


def test_the_byte_cap_bounds_every_batch_and_loses_nothing(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    from connectors.sizes import bytes_per_offset, record_bytes

    topic = topic_factory("bytecap", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(8):  # values of ~300 B; every fourth transaction aborted (offsets with no bytes)
        write_transaction(producer, topic, [_json(t * 10 + i, "n" * 280) for i in range(10)], commit=t % 4 != 3)
    size = {(r.partition, r.offset): record_bytes(r.key, r.value, r.headers) for r in read_all(kafka_bootstrap, topic)}
    ends = {p: 1 + max(o for q, o in size if q == p) for p in (0, 1)}
    estimate = bytes_per_offset({"bootstrap.servers": kafka_bootstrap}, {(topic, p): (0, ends[p]) for p in (0, 1)})
    # Under 64 records each, so the sample is the whole range: visible bytes over every offset,
    # aborted records and markers included (they make an offset cheaper).
    assert estimate == {(topic, p): sum(b for (q, _), b in size.items() if q == p) / ends[p] for p in (0, 1)}
    assert all(150 < w < 300 for w in estimate.values()), estimate

    # The cap is approximate where aborted records are unevenly spread (the estimate averages
    # them over the sample), so the bound is checked on a topic of committed records only.
    topic = topic_factory("bytecap-committed", partitions=2)
    for t in range(6):
        write_transaction(producer, topic, [_json(t * 10 + i, "n" * 280) for i in range(10)], commit=True)
    size = {(r.partition, r.offset): record_bytes(r.key, r.value, r.headers) for r in read_all(kafka_bootstrap, topic)}
    cap = 3_000  # about ten records per batch
    config = _config(topic, tmp_path, max_bytes_per_batch=cap)
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _table_keys(spark, pipeline.target) == _kafka_keys(kafka_bootstrap, topic) and report.rows == 60
    intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert len(intents) >= 6  # 60 records of ~300 B under a 3 kB cap
    for intent in intents:
        read = sum(b for (p, o), b in size.items() for r in intent.ranges if r.partition == p and r.start <= o < r.end)
        # Estimated from an average (record sizes differ by a few bytes, markers are free): within 5%.
        assert 0 < read <= cap * 1.05, f"batch {intent.batch_id} read {read} B under a {cap} B cap"


def test_replaying_a_committed_batch_is_a_no_op(spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    topic = topic_factory("replay", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, [_json(i, "x") for i in range(20)], commit=True)
    config = _config(topic, tmp_path)
    pipeline = config.pipelines[0]
    job = IngestJob(spark, config, pipeline, kafka_bootstrap)
    job.run_bounded()
    version = DeltaTable.forPath(spark, pipeline.target).history(1).first().version
    last = Ledger(spark, pipeline.ledger_path, pipeline.name).last()
    assert last is not None
    # No bad records: nothing was ever written to quarantine (the settled marker records that).
    assert not delta_table_exists(spark, pipeline.quarantine_path)

    replay = job.protocol._write(last, replayed=True)  # what step 1 does after a crash
    assert (replay.rows, replay.quarantined) == (0, 0)  # Delta skipped the append...
    assert DeltaTable.forPath(spark, pipeline.target).history(1).first().version == version  # ...no new commit
    # Not knowing the batch's bad count, the replay counted again: none, so still no quarantine table.
    assert not delta_table_exists(spark, pipeline.quarantine_path)
    assert len(_table_keys(spark, pipeline.target)) == 20


def test_bad_records_are_quarantined_and_offsets_advance(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    topic = topic_factory("bad", partitions=1)
    producer = transactional_producer(kafka_bootstrap)
    producer.begin_transaction()
    # The last two look like JSON: one with a byte that is not UTF-8 inside a string (the parse
    # hands it to Spark's parser, and the UTF-8 check runs), one of UTF-8 the parse reads itself.
    values = [_json(1, "ok"), b"{not json", None, b"\xff\xfe\x00bad", b'{"id": "not-an-int", "note": 1}',
              b"[1,2]", _json(2, "ok"), b'{"id": 3, "note": "caf\xc3\x28"}', '{"id": 4, "note": "é ✓"}'.encode()]
    for v in values:
        producer.produce(topic, value=v, key=b"k")
    producer.commit_transaction(30)
    config = _config(topic, tmp_path)
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert (report.rows, report.quarantined) == (3, 6)
    bad = spark.read.format("delta").load(pipeline.quarantine_path).orderBy("offset").collect()
    assert [r.offset for r in bad] == [1, 2, 3, 4, 5, 7]
    assert bad[1].value is None and "tombstone" in bad[1].error
    assert bytes(bad[2].value) == b"\xff\xfe\x00bad" and "UTF-8" in bad[2].error
    assert bytes(bad[5].value) == values[7] and bad[5].error == "value is not valid UTF-8"
    assert "UTF-8" not in bad[0].error + bad[3].error  # JSON errors, not UTF-8 ones
    assert all(r.topic == topic and r.partition == 0 for r in bad)
    good = spark.read.format("delta").load(pipeline.target).orderBy("id").collect()
    assert [(r.id, r.note) for r in good] == [(1, "ok"), (2, "ok"), (4, "é ✓")]
    last = Ledger(spark, pipeline.ledger_path, pipeline.name).last()
    assert last is not None and last.ends() == {(topic, 0): 10}  # 9 records + the commit marker


def test_a_schema_field_in_tidemarks_namespace_is_refused_before_anything_is_read(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory("reserved", partitions=1)
    config = _config(topic, tmp_path, schema="id INT, _tidemark_utf8 BOOLEAN")
    with pytest.raises(ConfigError, match="_tidemark_utf8.*rename them in `schema`"):
        IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded()
    assert not delta_table_exists(spark, config.pipelines[0].target)


def test_columns_built_ahead_are_built_once_and_a_failed_build_is_not_kept(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's call waits for the build :func:`columns_ahead` started on its thread instead
    of racing it, and a configuration whose build fails raises its error on every call, none kept."""
    builds: list[tuple[str, str]] = []
    started = threading.Event()
    real = transform._frame_columns

    def slow(session, pipeline, schemas, registry):  # type: ignore[no-untyped-def]
        builds.append((pipeline.target, threading.current_thread().name))
        started.set()
        time.sleep(0.3)  # the batch's call arrives while the build is under way
        return real(session, pipeline, schemas, registry)

    monkeypatch.setattr(transform, "_frame_columns", slow)
    good = _config("ahead", tmp_path / "good").pipelines[0]
    transform.columns_ahead(spark, good)
    transform.columns_ahead(spark, good)  # under way: no second thread, no second build
    assert started.wait(30)
    first = transform.frame_columns(spark, good)
    assert transform.frame_columns(spark, good) is first
    assert builds == [(good.target, "tidemark-columns-orders")]

    bad = _config("ahead", tmp_path / "bad", schema="id INT, _tidemark_utf8 BOOLEAN").pipelines[0]
    transform.columns_ahead(spark, bad)
    for _ in range(2):
        with pytest.raises(ConfigError, match="_tidemark_utf8"):
            transform.frame_columns(spark, bad)
    assert next(name for target, name in builds if target == bad.target) == "tidemark-columns-orders"
    assert len([1 for target, _ in builds if target == bad.target]) >= 2  # not kept: built again


def test_a_marker_only_range_costs_no_poll_timeout(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose range holds only aborted records and markers completes with no rows.

    With a 5 s ``kafkaConsumer.pollTimeoutMs`` a reader that waits for records that never
    come fails with a timeout instead of hanging for Spark's default 120 s, so this checks
    the behaviour without timing anything.
    """
    import pipelines.ingest as ingest_module

    real = ingest_module.spark_options
    monkeypatch.setattr(ingest_module, "spark_options",
                        lambda *a: {**real(*a), "kafkaConsumer.pollTimeoutMs": "5000"})
    topic = topic_factory("markers", partitions=1)
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, [_json(i, "a") for i in range(5)], commit=False)
    write_transaction(producer, topic, [_json(i, "b") for i in range(5)], commit=False)
    config = _config(topic, tmp_path)
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert report.rows == 0 and len(report.batches) == 1
    assert report.batches[0].intent.ends() == {(topic, 0): 12}


def test_a_bulk_read_leaves_at_most_a_small_fetch_per_partition_in_the_heap(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory) -> None:
    """Spark pools a batch's consumers for the next batch, and each keeps its last fetch
    response and poll: what a read leaves in the driver's heap must stay a few MiB per
    partition read, not the partition's data (pipelines.transform.BULK_READ_OPTIONS).
    Here 4 MiB fetches left 3 MiB and 32 MiB fetches 69 MiB (bench/diagnostics/read_heap_bench.py: other sizes)."""
    from confluent_kafka import Producer

    from connectors.kafka_config import spark_options
    from infra.spark import reachable_heap
    from offsets.ledger import Intent, Range, now_utc
    from pipelines.transform import read_ranges
    from tidemark.config import KafkaConnection

    partitions, per_partition = 4, 24_000
    topic = topic_factory("bulk-heap", partitions=partitions)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.kbytes": 1_048_576})
    value = b"x" * 1000
    for p in range(partitions):
        for _ in range(per_partition):
            producer.produce(topic, value=value, partition=p)
        producer.flush(60)
    intent = Intent("heap", 1, "w", now_utc(), tuple(Range(topic, p, 0, per_partition) for p in range(partitions)))
    options = spark_options(KafkaConnection(bootstrap_servers=kafka_bootstrap), kafka_bootstrap)
    # What a session's first read creates once (clients' metadata, generated code) is not what is measured.
    warm = topic_factory("bulk-heap-warm", partitions=partitions)
    for p in range(partitions):
        producer.produce(warm, value=value, partition=p)
    producer.flush(60)
    warm_intent = Intent("heap", 1, "w", now_utc(), tuple(Range(warm, p, 0, 1) for p in range(partitions)))
    assert read_ranges(spark, options, warm_intent).count() == partitions
    before = reachable_heap(spark)
    assert read_ranges(spark, options, intent).count() == partitions * per_partition
    kept = reachable_heap(spark) - before
    assert kept < partitions * (8 << 20), f"the read left {kept / 2**20:.0f} MiB reachable for {partitions} partitions"


def test_a_batch_is_read_through_the_kafka_sources_v2_scan_with_the_records_of_its_v1_relation(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory) -> None:
    """Tidemark's sessions read a batch's ranges through the Kafka source's V2 scan, which
    writes Spark's row once, instead of Spark's default V1 relation (infra.spark.V1_SOURCES).
    Both must give the same records: committed ones only, the ranges' exact ends (a range
    starting and ending next to transaction markers), keys, null values, headers and their
    null values, timestamps."""
    from connectors.kafka_config import spark_options
    from infra.spark import V1_SOURCES
    from offsets.ledger import Intent, Range, now_utc
    from pipelines.transform import read_ranges
    from tidemark.config import KafkaConnection

    topic = topic_factory("v2-read", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for n, commit in enumerate((True, False, True, True, False, True)):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, partition=i % 2, key=None if i == 3 else f"k{n}-{i}".encode(),
                             value=None if i == 4 else f'{{"n": {n}, "i": {i}}}'.encode(),
                             headers=[("h", f"{n}".encode()), ("empty", None)] if i % 2 else None)
        assert producer.flush(30) == 0  # else the end purges what is left, and every offset shifts
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    # Partition 0 holds 3 records and a marker per transaction: [4, 14) starts after the first
    # transaction's marker, at the aborted second's records, and ends inside the fourth.
    intent = Intent("v2", 1, "w", now_utc(), (Range(topic, 0, 4, 14), Range(topic, 1, 0, 12)))
    options = spark_options(KafkaConnection(bootstrap_servers=kafka_bootstrap), kafka_bootstrap)
    key = "spark.sql.sources.useV1SourceList"
    assert spark.conf.get(key) == V1_SOURCES
    # Spark's own list without `kafka`, so that an upgrade changing it is noticed here.
    default = spark._jvm.org.apache.spark.sql.internal.SQLConf.USE_V1_SOURCE_LIST().defaultValueString()
    assert V1_SOURCES.split(",") == [s for s in default.split(",") if s != "kafka"] != default.split(",")
    v2 = read_ranges(spark, options, intent)
    spark.conf.set(key, V1_SOURCES + ",kafka")
    try:
        v1 = read_ranges(spark, options, intent)
    finally:
        spark.conf.set(key, V1_SOURCES)
    assert "KafkaTable" in v2._jdf.queryExecution().analyzed().toString()
    assert "KafkaRelation" in v1._jdf.queryExecution().analyzed().toString()
    columns = ("partition", "offset", "topic", "key", "value", "timestamp", "timestampType", "headers")
    rows = [[tuple(r) for r in frame.select(*columns).orderBy("partition", "offset").collect()] for frame in (v2, v1)]
    assert rows[0] == rows[1]
    # Committed transactions 0, 2, 3 in range: partition 0 from offset 4 (transaction 2 at 8-10,
    # transaction 3 at 12-14, of which 14 is past the range), partition 1 (2 records and a marker
    # a transaction) before offset 12.
    assert [(r[0], r[1]) for r in rows[0]] == [(0, 8), (0, 9), (0, 10), (0, 12), (0, 13),
                                               (1, 0), (1, 1), (1, 6), (1, 7), (1, 9), (1, 10)]
    assert {json.loads(r[4])["n"] for r in rows[0] if r[4] is not None} == {0, 2, 3}
    assert any(r[3] is None for r in rows[0]) and any(r[4] is None for r in rows[0])
    assert {(h[0], None if h[1] is None else bytes(h[1])) for r in rows[0] if r[7] for h in r[7]} == {
        ("h", b"0"), ("h", b"2"), ("h", b"3"), ("empty", None)}


def test_a_second_writer_cannot_claim_a_claimed_batch(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path) -> None:
    topic = topic_factory("fence", partitions=1)
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, [_json(i, "x") for i in range(10)], commit=True)
    config = _config(topic, tmp_path)
    pipeline = config.pipelines[0]
    a = IngestJob(spark, config, pipeline, kafka_bootstrap)
    b = IngestJob(spark, config, pipeline, kafka_bootstrap)
    bounds = a.snapshot()
    # b claims batch 1 first (as if running concurrently) ...
    from offsets.ledger import Intent, now_utc
    from offsets.planner import plan_ranges

    ranges = plan_ranges({}, bounds, {tp: 0 for tp in bounds}, 100)
    b.protocol.ledger.append(Intent(pipeline.name, 1, b.protocol.writer_id, now_utc(), ranges))
    # ... so a, planning from the same state, must lose the claim and write nothing.
    a.protocol.recover = lambda: (None, None)  # type: ignore[method-assign]
    with pytest.raises(ConcurrentWriterError):
        a.protocol.run_batch(bounds)
    from offsets.tables import delta_table_exists

    assert not delta_table_exists(spark, pipeline.target)
