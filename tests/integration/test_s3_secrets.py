"""S3 credentials reach the clients and nothing else: not the output, the logs, or any object
an ingest run writes to the bucket (its table, quarantine, ledger, settled markers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import on_disk, s3_server
from tests.ingest_harness import Pipeline, run_ingest
from tests.kafka_helpers import transactional_producer
from tidemark.settings import load_settings
from tidemark.storage import s3_access

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("needs_s3")]


def test_an_ingest_to_s3_leaks_no_secret_key(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                             tmp_path: Path, table_root: str) -> None:
    topic = topic_factory("s3-secret")
    producer = transactional_producer(kafka_bootstrap)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, json.dumps({"id": i, "note": "n"}).encode())
    producer.produce(topic, b"not json")  # a quarantined record: the quarantine table is written too
    producer.commit_transaction(30)
    p = Pipeline.create(spark, kafka_bootstrap, topic, tmp_path, root=table_root)
    done = run_ingest(p.config)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = sorted(r.id for r in spark.read.format("delta").load(str(p.target)).select("id").collect())
    assert ids == list(range(50))
    assert spark.read.format("delta").load(f"{p.target}_quarantine").count() == 1  # the bad record, accounted for

    access = s3_access(load_settings())
    secret = access.secret_access_key
    assert secret and access.source == str(s3_server().credentials)  # type: ignore[union-attr]
    assert access.spark_conf()["spark.hadoop.fs.s3a.secret.key"] == secret  # the client itself gets it
    assert secret not in repr(access)
    assert secret not in done.stdout + done.stderr
    written = [f for f in on_disk(table_root).rglob("*") if f.is_file()]
    assert {"orders", "orders_quarantine", "orders_tidemark_ledger"} <= {f.relative_to(on_disk(table_root)).parts[0]
                                                                        for f in written}
    logs = [f for f in (load_settings().home_dir / "logs").glob("*.log*") if f.is_file()]
    for path in written + logs:
        assert secret.encode() not in path.read_bytes(), f"the S3 secret key is in {path}"
