"""G3, dedup and the quality audit on real Kafka, Spark and Delta.

Source transactions are written here the way the relay writes them (one Kafka
transaction, ``tidemark.*`` headers), which lets a test leave an event out: the
truncated transactions the policy exists for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from offsets.cut import IncompleteTransactionError
from offsets.ledger import Ledger
from outbox import wire
from pipelines.ingest import IngestJob
from quality.audit import audit
from tests.kafka_helpers import transactional_producer
from tidemark.config import TidemarkConfig, parse_config


def _config(bootstrap: str, tmp: Path, topics: list[str], name: str = "events", **extra: Any) -> TidemarkConfig:
    pipeline = {"name": name, "topics": topics, "target": str(tmp / name), "schema": "n BIGINT", **extra}
    return parse_config({"kafka": {"bootstrap_servers": bootstrap}, "pipelines": [pipeline]})


class SourceTxns:
    """Writes source transactions as the relay does; ``drop`` leaves chosen events out."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = transactional_producer(bootstrap)
        self.txid = 1000
        self.n = 0

    def write(self, events: list[tuple[str, int]], *, drop: frozenset[int] = frozenset(),
              bad: frozenset[int] = frozenset()) -> str:
        """``events``: (topic, partition) per event; returns the transaction's id as the table shows it.

        Events at ``bad`` positions carry a value that is not JSON (quarantined).
        """
        self.txid += 1
        lsn = f"0/{self.txid:X}"
        counts: dict[str, int] = defaultdict(int)
        for topic, _ in events:
            counts[topic] += 1
        self.producer.begin_transaction()
        for position, (topic, partition) in enumerate(events):
            if position in drop:
                continue
            value = b"not json" if position in bad else None
            self.produce(self.producer, events, position, value=value)
        self.producer.commit_transaction(30)
        return f"{lsn}/{self.txid}"

    def produce(self, producer: Producer, events: list[tuple[str, int]], position: int, *,
                value: bytes | None = None, timestamp: int = 0) -> str:
        """Event ``position`` of the current transaction (``self.txid``) through ``producer``,
        whose Kafka transaction is the caller's; returns the source transaction's id."""
        lsn = f"0/{self.txid:X}"
        counts: dict[str, int] = defaultdict(int)
        for topic, _ in events:
            counts[topic] += 1
        self.n += 1
        headers = [(wire.EVENT_ID, str(uuid.uuid4())), (wire.TXID, str(self.txid)), (wire.LSN, lsn),
                   (wire.POSITION, str(position)), (wire.SIZE, str(len(events))),
                   (wire.TOPIC_COUNTS, json.dumps(dict(sorted(counts.items())), separators=(",", ":")))]
        topic, partition = events[position]
        producer.produce(topic, value=value or json.dumps({"n": self.n}).encode(), key=b"k", partition=partition,
                         headers=headers, timestamp=timestamp)
        return f"{lsn}/{self.txid}"


def _txns(spark: Any, target: str, version: int | None = None) -> dict[str, tuple[int, int, bool]]:
    """Per source transaction in the table: (rows, expected, released)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    rows = reader.load(target).where("_tidemark_txn IS NOT NULL").groupBy("_tidemark_txn.id").agg(
        F.count(F.lit(1)), F.max("_tidemark_txn.expected"), F.max("_tidemark_txn.released")).collect()
    return {r[0]: (int(r[1]), int(r[2]), bool(r[3])) for r in rows}


def _versions(spark: Any, target: str) -> list[int]:
    from delta.tables import DeltaTable

    return sorted(int(r.version) for r in DeltaTable.forPath(spark, target).history().select("version").collect())


def test_truncated_transaction_waits_then_is_released_flagged_and_reported(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = topic_factory("g3a", partitions=2), topic_factory("g3b", partitions=2)
    src = SourceTxns(kafka_bootstrap)
    whole1 = src.write([(a, 0), (b, 1), (a, 1)])
    truncated = src.write([(a, 0), (b, 0)], drop=frozenset({1}))  # its b event never reached Kafka
    whole2 = src.write([(a, 0), (b, 0), (b, 1)])  # after the truncated one in a[0]: waits behind it
    # The wait counts from the first batch that found the event missing below the LSO; rather
    # than race a cold JVM against a short timeout, the first run waits an hour and the second a second.
    config = _config(kafka_bootstrap, tmp_path, [a, b], transactions={"incomplete_timeout_seconds": 3600})
    pipeline = config.pipelines[0]

    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _txns(spark, pipeline.target) == {whole1: (3, 3, False)}
    last = Ledger(spark, pipeline.ledger_path, pipeline.name).last()
    assert last is not None and last.held == 2 and last.released == ()
    assert set(last.waiting) == {truncated}  # whole2 is whole in Kafka: it waits, but not for an event
    since = last.waiting[truncated].since

    time.sleep(1.5)
    config = _config(kafka_bootstrap, tmp_path, [a, b], transactions={"incomplete_timeout_seconds": 1})
    pipeline = config.pipelines[0]
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _txns(spark, pipeline.target) == {whole1: (3, 3, False), truncated: (1, 2, True), whole2: (3, 3, False)}
    released = [i for i in Ledger(spark, pipeline.ledger_path, pipeline.name).history() if i.released]
    assert [i.released for i in released] == [(truncated,)]
    assert released[0].planned_at - since >= timedelta(seconds=1) and not released[0].waiting

    report = audit(spark, pipeline, kafka_options={"kafka.bootstrap.servers": kafka_bootstrap},
                   client_config={"bootstrap.servers": kafka_bootstrap}, docs_dir=tmp_path / "docs")
    verdicts = {v.check: v for v in report.verdicts}
    assert not verdicts["every source transaction complete"].passed
    assert truncated in verdicts["every source transaction complete"].observed
    assert verdicts["Kafka records = table rows + quarantine rows"].passed
    assert verdicts["event id unique"].passed and verdicts["(topic, partition, offset) unique"].passed
    assert verdicts["columns include the pipeline's schema"].passed
    assert not report.passed and report.docs.exists()

    # The command: a verdict table, the Data Docs path, exit 1.
    path = tmp_path / "tidemark.yaml"
    path.write_text(yaml.safe_dump(json.loads(config.model_dump_json(by_alias=True, exclude_none=True))))
    done = subprocess.run([sys.executable, "-m", "tidemark.cli", "check", pipeline.name, "--config", str(path),
                           "--docs", str(tmp_path / "docs")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = next(line for line in done.stdout.splitlines() if "every source transaction complete" in line)
    assert " FAIL " in verdict and truncated in verdict, verdict
    assert "checks FAILED" in done.stdout and "Data Docs: file://" in done.stdout


def test_stop_policy_writes_nothing_of_an_overdue_transaction(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = topic_factory("g3s", partitions=1), topic_factory("g3s", partitions=1)
    src = SourceTxns(kafka_bootstrap)
    truncated = src.write([(a, 0), (b, 0)], drop=frozenset({0}))

    def config(timeout: float) -> TidemarkConfig:
        return _config(kafka_bootstrap, tmp_path, [a, b],
                       transactions={"incomplete_timeout_seconds": timeout, "on_incomplete": "stop"})

    # The first run finds the event missing and starts the wait: an empty batch carries it in
    # the ledger. (An hour: a cold run's second plan would otherwise be past a short timeout.)
    pipeline = config(3600).pipelines[0]
    IngestJob(spark, config(3600), pipeline, kafka_bootstrap).run_bounded()
    first = Ledger(spark, pipeline.ledger_path, pipeline.name).last()
    assert first is not None and first.is_empty and set(first.waiting) == {truncated}
    time.sleep(2.5)  # past the timeout (planning times are whole seconds)
    pipeline = config(1).pipelines[0]
    with pytest.raises(IncompleteTransactionError, match=truncated):
        IngestJob(spark, config(1), pipeline, kafka_bootstrap).run_bounded()
    assert spark.read.format("delta").load(pipeline.target).count() == 0


def test_every_table_version_holds_whole_transactions_under_tiny_batches(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import random

    topics = [topic_factory("g3m", partitions=3) for _ in range(3)]
    src, rng = SourceTxns(kafka_bootstrap), random.Random(11)
    written = {}
    for _ in range(16):
        events = [(rng.choice(topics), rng.randrange(3)) for _ in range(rng.randint(1, 8))]
        written[src.write(events)] = len(events)
    config = _config(kafka_bootstrap, tmp_path, topics, max_records_per_batch=30)
    pipeline = config.pipelines[0]
    report = IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert len(report.batches) >= 3
    intents = Ledger(spark, pipeline.ledger_path, pipeline.name).history()
    assert any(i.held for i in intents), "no batch cut a transaction: the test proves less than it claims"
    for version in _versions(spark, pipeline.target):
        for txn, (rows, expected, released) in _txns(spark, pipeline.target, version).items():
            assert rows == expected == written[txn] and not released, f"version {version}: {txn} has {rows} rows"
    assert {t: n for t, (n, _, _) in _txns(spark, pipeline.target).items()} == written


def test_the_per_event_and_per_transaction_ids_are_written_without_a_dictionary(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """infra.spark.PLAIN_ENCODED_COLUMNS reaches the Delta writer: those columns' chunks are
    plainly encoded, while a repetitive column keeps Parquet's dictionary (the check can fail)."""
    import pyarrow.parquet as pq

    topic = topic_factory("g3enc", partitions=1)
    src = SourceTxns(kafka_bootstrap)
    for size in (1, 3, 2):
        src.write([(topic, 0)] * size)
    config = _config(kafka_bootstrap, tmp_path, [topic])
    IngestJob(spark, config, config.pipelines[0], kafka_bootstrap).run_bounded()
    files = sorted(Path(config.pipelines[0].target).glob("*.parquet"))
    assert files
    for file in files:
        meta = pq.ParquetFile(file).metadata
        for g in range(meta.num_row_groups):
            chunks = {meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c)
                      for c in range(meta.num_columns)}
            for path in ("_tidemark_event_id", "_tidemark_txn.id"):
                assert not chunks[path].has_dictionary_page, f"{file.name}: {path} {chunks[path].encodings}"
                assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(chunks[path].encodings), path
            assert chunks["_kafka_topic"].has_dictionary_page, f"{file.name}: {chunks['_kafka_topic'].encodings}"


def test_dedup_quarantines_copies_and_the_audit_catches_them_without_it(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory("dedup", partitions=2)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})  # not transactional, not idempotent

    def send(ids: list[int]) -> None:
        for i in ids:
            plain.produce(topic, value=json.dumps({"n": i}).encode(), key=str(i % 5).encode(),
                          partition=i % 2, headers=[("id", f"event-{i}")])
        plain.flush(30)

    send(list(range(30)))
    send(list(range(10)))  # copies in the same batch as the originals
    deduped = _config(kafka_bootstrap, tmp_path, [topic], name="deduped", dedup={})
    plain_cfg = _config(kafka_bootstrap, tmp_path, [topic], name="plain")
    IngestJob(spark, deduped, deduped.pipelines[0], kafka_bootstrap).run_bounded()
    send([10, 11, 12, 13, 14, 30, 31])  # copies of rows already in the table, and new events
    IngestJob(spark, deduped, deduped.pipelines[0], kafka_bootstrap).run_bounded()
    IngestJob(spark, plain_cfg, plain_cfg.pipelines[0], kafka_bootstrap).run_bounded()

    pipeline = deduped.pipelines[0]
    ids = [r[0] for r in spark.read.format("delta").load(pipeline.target).select("_tidemark_event_id").collect()]
    assert sorted(ids) == sorted(f"event-{i}" for i in range(32))
    errors = [r.error for r in spark.read.format("delta").load(pipeline.quarantine_path).collect()]
    assert len(errors) == 15 and all(e.startswith("duplicate: event id event-") for e in errors)
    assert sum("in this batch" in e for e in errors) == 10 and sum("already in the table" in e for e in errors) == 5

    options = {"kafka_options": {"kafka.bootstrap.servers": kafka_bootstrap},
               "client_config": {"bootstrap.servers": kafka_bootstrap}, "docs_dir": tmp_path / "docs"}
    good = audit(spark, pipeline, **options)
    assert good.passed, good.verdicts
    bad = {v.check: v for v in audit(spark, plain_cfg.pipelines[0], **options).verdicts}
    assert not bad["event id unique"].passed and "30 unexpected" in bad["event id unique"].observed
    assert bad["Kafka records = table rows + quarantine rows"].passed
    assert bad["(topic, partition, offset) unique"].passed

    # A record written twice under different event ids: only the lineage check can see it.
    from pyspark.sql import functions as F

    copy = (spark.read.format("delta").load(pipeline.target).limit(1)
            .withColumn("_tidemark_event_id", F.lit("a-copy")))
    copy.write.format("delta").mode("append").save(pipeline.target)
    copied = {v.check: v for v in audit(spark, pipeline, **options).verdicts}
    assert copied["event id unique"].passed
    assert not copied["(topic, partition, offset) unique"].passed
    assert "2 unexpected" in copied["(topic, partition, offset) unique"].observed


def test_the_planning_scan_reads_headers_as_the_table_column_does(spark, kafka_bootstrap: str,  # type: ignore[no-untyped-def]
                                                                  topic_factory) -> None:
    """The cut (librdkafka, Python) and ``_tidemark_txn`` (Spark) read the relay's headers alike,
    malformed and foreign ones included; they must, or a cut could disagree with the audit."""
    from pyspark.sql import functions as F

    from connectors.kafka_config import spark_options
    from connectors.range_reader import headed_records
    from offsets.ledger import Intent, Range, now_utc
    from pipelines.transactions.headers import (
        HEADERS_COLUMN,
        guard,
        header,
        topic_filter,
        txn_headers,
        txn_of,
        txn_struct,
    )
    from pipelines.transform import read_ranges

    topic, other = topic_factory("g3-headers"), "elsewhere"
    good = [(wire.TXID, b"7"), (wire.LSN, b"0/A"), (wire.POSITION, b"1"), (wire.SIZE, b"3")]
    counts = (wire.TOPIC_COUNTS, json.dumps({topic: 2, other: 1}).encode())
    cases: list[list[tuple[str, bytes | None]]] = [
        [*good, counts],                                             # 2 of 3 events here
        [*good],                                                     # no counts: all 3 expected here
        [*good, (wire.TOPIC_COUNTS, json.dumps({other: 3}).encode())],  # none here: 0 expected
        [*good, (wire.TOPIC_COUNTS, b"not json")],                      # unreadable counts: the size
        [*good, (wire.TOPIC_COUNTS, b'{"a": 1.5}')],                    # not whole numbers: the size
        [*good, (wire.TOPIC_COUNTS, b"[1, 2]")],                        # not an object: the size
        [*good, (wire.TOPIC_COUNTS, json.dumps({topic: 2}).encode()), (wire.TOPIC_COUNTS, b"{}")],  # first one counts
        # The relay's compact sorted form, read by tidemark_txn_headers; near misses go to from_json.
        [*good, (wire.TOPIC_COUNTS, json.dumps({other: 1, topic: 2}, separators=(",", ":")).encode())],
        [*good, (wire.TOPIC_COUNTS, json.dumps({other: 1, topic: 2}, separators=(",", ":")).encode())],  # remembered
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":2,"{other}":1}}'.encode())],  # unsorted
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":02}}'.encode())],             # a leading zero
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":-1}}'.encode())],             # negative
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":2147483648}}'.encode())],     # over an int
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":1234567890}}'.encode())],     # ten digits
        # an escaped key (the same topic), read by from_json:
        [*good, (wire.TOPIC_COUNTS, json.dumps({topic: 2}, separators=(",", ":")).replace("-", r"\u002d", 1).encode())],
        [*good, (wire.TOPIC_COUNTS, b"{}")],                                     # nothing anywhere
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":2,}}'.encode())],              # a trailing comma
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":1,"{topic}":1}}'.encode())],   # a repeated key: both count
        # a sum past INT: unreadable (all 3 expected), where Spark's `+` failed the whole batch:
        [*good, (wire.TOPIC_COUNTS, f'{{"{topic}":2000000000,"{topic}":2000000000}}'.encode())],
        [(wire.TXID, b"7"), (wire.LSN, b"0/A"), (wire.POSITION, b" 2 "), (wire.SIZE, b"+3")],  # signs, spaces
        [(wire.TXID, b"7"), (wire.LSN, b"0/A"), (wire.POSITION, b"x"), (wire.SIZE, b"3")],      # bad position
        [(wire.TXID, b"7"), (wire.LSN, b"0/A"), (wire.POSITION, b"0"), (wire.SIZE, b"0")],      # size 0
        [(wire.TXID, b"7"), (wire.LSN, b"0/A"), (wire.POSITION, b"0"), (wire.SIZE, b"99999999999")],  # overflow
        [(wire.TXID, None), (wire.LSN, b"0/A"), (wire.POSITION, b"0"), (wire.SIZE, b"2")],      # null txid
        [(wire.LSN, b"0/A"), (wire.POSITION, b"0"), (wire.SIZE, b"2")],                      # no txid
        [(wire.EVENT_ID, b"only an id")],
        [(wire.EVENT_ID, b"first id"), *good, (wire.EVENT_ID, b"second id")],  # the first event id
        [(wire.EVENT_ID, None), *good, (wire.EVENT_ID, b"later")],          # a null event id first: null
        [(wire.TXID, b"8"), *good, (wire.TXID, b"9"), (wire.TOPIC_COUNTS, None)],    # the first txid; null counts
        [*good, (wire.TOPIC_COUNTS, None), counts],                     # the first counts header, null
        [(wire.TXID, "\u00e9".encode()), (wire.LSN, b"0/\xff"), (wire.POSITION, b"0"), (wire.SIZE, b"2"),
         (wire.EVENT_ID, b"\xff\xfeid")],                                                       # odd bytes
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for headers in cases:
        producer.produce(topic, value=b"{}", headers=headers, partition=0)
    producer.produce(topic, value=b"{}", partition=0)  # no headers at all
    producer.flush(10)
    end = len(cases) + 1
    pipeline = _config(kafka_bootstrap, Path("/tmp"), [topic]).pipelines[0]

    mine = topic_filter(pipeline)
    scanned = {offset: txn_of(headers, mine)
               for _, _, offset, _, headers in headed_records({"bootstrap.servers": kafka_bootstrap},
                                                              [(topic, 0, 0, end)])}
    intent = Intent(pipeline.name, 1, "w", now_utc(), (Range(topic, 0, 0, end),))
    t, g = txn_struct(), guard()
    read = read_ranges(spark, spark_options(_kafka(kafka_bootstrap), kafka_bootstrap), intent)
    assert spark.catalog.functionExists("tidemark_txn_headers")
    # from_json alone, and Tidemark's reader of the relay's form: the same column.
    slow, rows = [(read.withColumn(HEADERS_COLUMN, txn_headers(pipeline, fast=fast))
                   .select("offset", t["id"].alias("id"), t["position"].alias("position"),
                           t["expected"].alias("expected"), HEADERS_COLUMN, F.when(g.tripped, g.why).alias("flagged"),
                           header(wire.EVENT_ID).alias("event_id"))
                   .orderBy("offset").collect()) for fast in (False, True)]
    assert [tuple(r) for r in rows] == [tuple(r) for r in slow]
    # The event id a G3 pipeline takes from the same pass is the header as `header` reads it.
    assert pipeline.event_id == f"header:{wire.EVENT_ID}"
    assert [r[HEADERS_COLUMN]["event"] if r[HEADERS_COLUMN] else None for r in rows] == [r.event_id for r in rows]
    assert {r.event_id for r in rows} >= {"only an id", "first id", None}
    column = {r.offset: None if r.id is None else (r.id, r.position, r.expected) for r in rows}
    # A guarded write fails on exactly the records the scan keeps for the cut (multi-event ones).
    assert {r.offset for r in rows if r.flagged is not None} == {
        o for o, v in column.items() if v is not None and v[2] > 1}
    assert any(r.flagged is not None for r in rows) and any(r.flagged is None for r in rows)
    assert len(column) == end and len(scanned) == end - 1  # the record without headers is not scanned
    assert column.pop(end - 1) is None
    assert scanned == column
    assert scanned[0] == ("0/A/7", 1, 2) and scanned[1] == ("0/A/7", 1, 3) and scanned[2] == ("0/A/7", 1, 0)
    assert sum(v is None for v in scanned.values()) >= 5  # the malformed ones are single events in both


def _kafka(bootstrap: str):  # type: ignore[no-untyped-def]
    from tidemark.config import KafkaConnection

    return KafkaConnection(bootstrap_servers=bootstrap)


def _ledger_rows(spark: Any, pipeline: Any, batch_id: int) -> list[bool]:
    """The ``guarded`` flag of every ledger row of a batch, claim and revision alike, in the table itself."""
    rows = spark.read.format("delta").load(pipeline.ledger_path).where(f"batch_id = {batch_id}").collect()
    return sorted(bool(json.loads(r.decisions).get("guarded")) for r in rows)


def _plain_records(bootstrap: str, topic: str, count: int) -> None:
    """``count`` committed records without relay headers (each its own transaction, for G3)."""
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for n in range(count):
        producer.produce(topic, value=json.dumps({"n": 10_000 + n}).encode(), partition=n % 2)
    producer.commit_transaction(30)


def test_g3_is_checked_in_the_write_until_a_batch_meets_a_multi_event_transaction(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path, monkeypatch) -> None:
    """``transactions.scan: auto``: batches with no multi-event transaction are not scanned;
    the first that has one fails its own write, is revised with the scan, and lands cut;
    the batch after a scan that found some is scanned at planning."""
    from pipelines.transactions import plan

    topic = topic_factory("g3guard", partitions=2)
    src = SourceTxns(kafka_bootstrap)
    singles = {src.write([(topic, n % 2)]) for n in range(4)}
    _plain_records(kafka_bootstrap, topic, 6)
    config = _config(kafka_bootstrap, tmp_path, [topic])
    pipeline = config.pipelines[0]
    scanned: list[int] = []
    real_scan = plan.scan

    def counted_scan(client_config: Any, pipeline: Any, intent: Any) -> Any:
        scanned.append(intent.batch_id)
        return real_scan(client_config, pipeline, intent)

    monkeypatch.setattr(plan, "scan", counted_scan)
    ledger = Ledger(spark, pipeline.ledger_path, pipeline.name)

    def ingest() -> None:
        IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()

    # 1. Single-event transactions and records without headers: checked in the write, no scan.
    ingest()
    assert scanned == [] and _ledger_rows(spark, pipeline, 1) == [True]
    assert spark.read.format("delta").load(pipeline.target).count() == 10
    assert set(_txns(spark, pipeline.target)) == singles

    # 2. A two-event transaction whose values are both bad: no target row, but the check
    #    covers quarantine-bound records too, so the write fails and the batch is revised.
    bad = src.write([(topic, 0), (topic, 1)], bad=frozenset({0, 1}))
    ingest()
    assert scanned == [2] and _ledger_rows(spark, pipeline, 2) == [False, True]
    revised = ledger.get(2)
    assert revised is not None and not revised.guarded and revised.txns == 1 and revised.held == 0
    quarantined = spark.read.format("delta").load(pipeline.quarantine_path).collect()
    assert len(quarantined) == 2
    assert {r.error for r in quarantined} == {f"value does not parse as JSON matching the schema: {pipeline.schema_ddl}"}
    assert {{h.key: h.value for h in r.headers}[wire.TXID].decode() for r in quarantined} == {bad.split("/")[-1]}
    assert spark.read.format("delta").load(pipeline.target).count() == 10

    # 3. After a scan that found one: scanned at planning (no check, no revision), cut by the scan.
    whole = src.write([(topic, 0), (topic, 1), (topic, 0)])
    partial = src.write([(topic, 1), (topic, 0)], drop=frozenset({1}))  # its second event never arrives
    ingest()
    # (Then batch 4 is planned, scanned, and cut to nothing: only the held transaction is left.)
    assert scanned[:2] == [2, 3] and set(scanned[2:]) == {4} and _ledger_rows(spark, pipeline, 3) == [False]
    third = ledger.last()
    assert third is not None and third.batch_id == 3 and third.txns == 2 and third.held == 1
    txns = _txns(spark, pipeline.target)
    assert txns[whole] == (3, 3, False) and partial not in txns and set(txns) == singles | {whole}
    assert max(_txns(spark, pipeline.target, v).get(whole, (3,))[0] for v in _versions(spark, pipeline.target)) == 3

    # 4. A new pipeline on the same topic: the probe of its first batch sees the multi-event
    #    transactions among the first records, so that batch is scanned at planning, not guarded.
    second = _config(kafka_bootstrap, tmp_path, [topic], name="again").pipelines[0]
    IngestJob(spark, config, second, kafka_bootstrap).run_bounded()
    assert _ledger_rows(spark, second, 1) == [False]
    first = Ledger(spark, second.ledger_path, second.name).get(1)
    assert first is not None and first.txns == 3 and first.held == 1
    assert _txns(spark, second.target) == txns


def test_crashes_around_a_revision_replay_it_exactly(  # type: ignore[no-untyped-def]
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:
    """SIGKILL after a guarded batch's claim, then (in the replay that trips its check) right
    after its revision is appended: the restart writes that revision (no second one), and
    the table is exactly the topic's committed records. (The slow G3 crash test cannot
    reach these points: its relay data has multi-event transactions in every batch.)"""
    from tests.ingest_harness import ingest_argv, process_env

    a, b = topic_factory("g3rev", partitions=2), topic_factory("g3rev", partitions=1)
    src = SourceTxns(kafka_bootstrap)
    written = {src.write([(a, 0)]): 1, src.write([(a, 1)]): 1, src.write([(b, 0)]): 1}
    config = _config(kafka_bootstrap, tmp_path, [a, b])
    pipeline = config.pipelines[0]
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()  # batch 1: guarded, no trip
    assert _ledger_rows(spark, pipeline, 1) == [True]
    written |= {src.write([(a, 1), (b, 0)]): 2, src.write([(b, 0), (a, 0), (a, 1)]): 3}
    held = src.write([(a, 1), (b, 0)], drop=frozenset({0}))
    path = tmp_path / "tidemark.yaml"
    path.write_text(yaml.safe_dump(json.loads(config.model_dump_json(by_alias=True, exclude_none=True))))

    def crash_at(point: str) -> None:
        crashed = subprocess.run(ingest_argv(path, pipeline=pipeline.name), env=process_env(point),
                                 capture_output=True, text=True, timeout=300, check=False)
        assert crashed.returncode == -9, crashed.stderr[-3000:]

    crash_at("claimed")  # batch 2 claimed guarded (the batch before was guarded), nothing written
    assert _ledger_rows(spark, pipeline, 2) == [True]
    crash_at("revised")  # the replay of batch 2 trips its check and revises it
    assert _ledger_rows(spark, pipeline, 2) == [False, True]
    assert spark.read.format("delta").load(pipeline.target).count() == 3  # batch 1 only

    done = subprocess.run(ingest_argv(path, pipeline=pipeline.name), env=process_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replayed batch 2" in done.stderr
    assert _ledger_rows(spark, pipeline, 2) == [False, True]  # the stored revision, not a new one
    stored = Ledger(spark, pipeline.ledger_path, pipeline.name).get(2)
    assert stored is not None and stored.txns == 3 and stored.held == 1
    assert {t: n for t, (n, _, _) in _txns(spark, pipeline.target).items()} == written
    assert held not in _txns(spark, pipeline.target)


def test_a_source_transaction_across_the_first_starts_lands_whole_without_a_wait(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``start: latest`` takes each partition's LSO, and a Kafka commit reaches partitions one at
    a time: a source transaction committed in a[1] but still open in a[0] lies across the
    starts. The first batch's start in a[1] moves back to its first event, so it lands whole
    as soon as a[0] commits, instead of waiting out incomplete_timeout (an hour here)."""
    a = topic_factory("g3start", partitions=2)
    src = SourceTxns(kafka_bootstrap)
    src.write([(a, 0), (a, 1)])  # wholly before the start: never read
    src.txid += 1
    events = [(a, 0), (a, 1)]
    open_part, committed_part = transactional_producer(kafka_bootstrap), transactional_producer(kafka_bootstrap)
    open_part.begin_transaction()
    across = src.produce(open_part, events, 0)
    open_part.flush(30)
    committed_part.begin_transaction()
    src.produce(committed_part, events, 1)
    committed_part.commit_transaction(30)
    config = _config(kafka_bootstrap, tmp_path, [a], start="latest",
                     transactions={"incomplete_timeout_seconds": 3600})
    pipeline = config.pipelines[0]
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    open_part.commit_transaction(30)
    after = src.write([(a, 1), (a, 0)])
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _txns(spark, pipeline.target) == {across: (2, 2, False), after: (2, 2, False)}
    _assert_every_version_whole(spark, pipeline.target)


def test_a_start_timestamp_between_a_transactions_events_takes_it_whole(
        spark, kafka_bootstrap: str, topic_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Events of one transaction carry different timestamps: a start timestamp between them
    moves the start of the partition with the earlier one back, so it lands whole, at once."""
    a = topic_factory("g3stamp", partitions=2)
    src = SourceTxns(kafka_bootstrap)
    # Ahead of the clock: commit markers carry the time they are written, and must fall before the start.
    now = int(time.time() * 1000) + 20 * 60_000
    placed: dict[str, str] = {}
    for name, stamps in (("before", (now - 120_000, now - 120_000)), ("across", (now - 60_000, now + 60_000)),
                         ("after", (now + 120_000, now + 120_000))):
        src.txid += 1
        events = [(a, 1), (a, 0)]
        src.producer.begin_transaction()
        for position, stamp in enumerate(stamps):
            txn = src.produce(src.producer, events, position, timestamp=stamp)
        src.producer.commit_transaction(30)
        placed[name] = txn
    start = datetime.fromtimestamp(now / 1000, UTC).isoformat()
    config = _config(kafka_bootstrap, tmp_path, [a], start={"timestamp": start},
                     transactions={"incomplete_timeout_seconds": 3600})
    pipeline = config.pipelines[0]
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    assert _txns(spark, pipeline.target) == {placed["across"]: (2, 2, False), placed["after"]: (2, 2, False)}
    _assert_every_version_whole(spark, pipeline.target)


def _assert_every_version_whole(spark: Any, target: str) -> None:
    """Each Delta version of ``target``, read back as of itself, holds whole source transactions only."""
    versions = _versions(spark, target)
    assert versions
    for version in versions:
        assert all(rows == expected and not released
                   for rows, expected, released in _txns(spark, target, version).values()), version
