"""The local stack really does what every guarantee relies on.

Kafka transactions hide aborted records from read_committed readers (confluent-kafka
and Spark's Kafka source alike), Delta skips a write whose ``txnAppId``/``txnVersion``
it has already committed, and PostgreSQL serves logical replication slots.
"""

from __future__ import annotations

import psycopg2
import pytest

from tests.kafka_helpers import read_all, transactional_producer, write_transaction

COMMITTED_1 = [f"c1-{i}".encode() for i in range(5)]
ABORTED = [f"ab-{i}".encode() for i in range(7)]
COMMITTED_2 = [f"c2-{i}".encode() for i in range(3)]


@pytest.fixture(scope="module")
def mixed_topic(kafka_bootstrap: str, topic_factory) -> str:  # type: ignore[no-untyped-def]
    """One partition: a committed, an aborted, then another committed transaction."""
    topic = topic_factory("mixed", partitions=1)
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, COMMITTED_1, commit=True)
    write_transaction(producer, topic, ABORTED, commit=False)
    write_transaction(producer, topic, COMMITTED_2, commit=True)
    return topic


def test_aborted_records_are_on_the_log(kafka_bootstrap: str, mixed_topic: str) -> None:
    """read_uncommitted sees the aborted batch, so the next test's filtering is real."""
    values = [r.value for r in read_all(kafka_bootstrap, mixed_topic, isolation="read_uncommitted")]
    assert values == COMMITTED_1 + ABORTED + COMMITTED_2


def test_read_committed_consumer_sees_only_committed(kafka_bootstrap: str, mixed_topic: str) -> None:
    records = read_all(kafka_bootstrap, mixed_topic, isolation="read_committed")
    assert [r.value for r in records] == COMMITTED_1 + COMMITTED_2
    # The offsets jump over the aborted records and the transaction markers.
    offsets = [r.offset for r in records]
    assert offsets[:5] == [0, 1, 2, 3, 4]
    assert offsets[5] > 5 + len(ABORTED)


def test_spark_kafka_reader_sees_only_committed(spark, kafka_bootstrap: str, mixed_topic: str) -> None:  # type: ignore[no-untyped-def]
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", mixed_topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    rows = sorted(df.select("offset", "value").collect())
    assert [bytes(r.value) for r in rows] == COMMITTED_1 + COMMITTED_2


def test_delta_skips_a_repeated_txn_version(spark, delta_path: str) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    batch = spark.createDataFrame([(i, f"v{i}") for i in range(10)], "id INT, v STRING")

    def write(version: int) -> None:
        (batch.write.format("delta").mode("append")
         .option("txnAppId", "stack-test").option("txnVersion", version).save(delta_path))

    write(1)
    write(1)  # a replay: Delta must skip it
    assert spark.read.format("delta").load(delta_path).count() == 10
    write(2)
    assert spark.read.format("delta").load(delta_path).count() == 20
    history = DeltaTable.forPath(spark, delta_path).history().collect()
    assert len([h for h in history if h.operation == "WRITE"]) == 2


def test_postgres_serves_a_logical_replication_slot(postgres_dsn: str) -> None:
    conn = psycopg2.connect(postgres_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            assert cur.fetchone()[0] == "logical"
            cur.execute("CREATE TABLE IF NOT EXISTS slot_probe (id int primary key, note text)")
            cur.execute("SELECT pg_create_logical_replication_slot('stack_probe', 'test_decoding')")
            try:
                cur.execute("INSERT INTO slot_probe VALUES (1, 'hello')")
                cur.execute("SELECT data FROM pg_logical_slot_get_changes('stack_probe', NULL, NULL)")
                changes = [row[0] for row in cur.fetchall()]
            finally:
                cur.execute("SELECT pg_drop_replication_slot('stack_probe')")
        assert changes[0].startswith("BEGIN")
        assert "table public.slot_probe: INSERT: id[integer]:1 note[text]:'hello'" in changes
        assert changes[-1].startswith("COMMIT")
    finally:
        conn.close()
