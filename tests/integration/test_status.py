"""The operator's commands read ledgers without a JVM (delta-rs) and say the same as Spark does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from offsets.ledger import Intent, _intent, _merged, read_last, read_ledger
from pipelines.ingest import IngestJob
from tests.kafka_helpers import transactional_producer, write_transaction
from tidemark.config import parse_config

# Runs a CLI command in a fresh interpreter and fails if it started a JVM (PySpark's gateway).
_NO_JVM = ("import sys, tidemark.cli.main as cli; rc = cli.main(sys.argv[1:]); "
           "spark = sys.modules.get('pyspark'); "
           "assert spark is None or spark.SparkContext._gateway is None, 'the command started a JVM'; sys.exit(rc)")


def _run(*argv: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run([sys.executable, "-c", _NO_JVM, *argv], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _spark_history(spark, path: str, pipeline: str) -> list[Intent]:  # type: ignore[no-untyped-def]
    """The ledger's intents as Spark reads its rows (naive local timestamps, Spark's structs)."""
    rows = spark.read.format("delta").load(path).where(f"pipeline = '{pipeline}'").collect()
    return _merged(_intent(row.asDict(recursive=True)) for row in rows)


def test_status_and_offsets_show_read_the_ledger_without_a_jvm(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    topic = topic_factory("status", partitions=2)
    producer = transactional_producer(kafka_bootstrap)
    for t in range(5):
        write_transaction(producer, topic, [json.dumps({"id": t * 10 + i}).encode() for i in range(8)],
                          commit=t != 2)
    raw = {"kafka": {"bootstrap_servers": kafka_bootstrap},
           "pipelines": [{"name": "orders", "topics": [topic], "target": str(tmp_path / "orders"),
                          "schema": "id INT", "max_records_per_batch": 12}]}
    config = parse_config(raw)
    pipeline = config.pipelines[0]
    path = tmp_path / "tidemark.yaml"
    path.write_text(yaml.safe_dump(raw))

    assert read_ledger(pipeline.ledger_path, "orders") == [] and read_last(pipeline.ledger_path, "orders") is None
    IngestJob(spark, config, pipeline, kafka_bootstrap).run_bounded()
    spark_history = _spark_history(spark, pipeline.ledger_path, "orders")
    assert len(spark_history) >= 3  # the cap split the work
    assert read_ledger(pipeline.ledger_path, "orders") == spark_history
    assert read_ledger(pipeline.ledger_path, "orders", first=2, last=3) == [i for i in spark_history
                                                                           if 2 <= i.batch_id <= 3]
    assert read_last(pipeline.ledger_path, "orders") == spark_history[-1]
    assert read_ledger(pipeline.ledger_path, "another") == []

    status = _run("status", "--config", str(path), "--no-relay", "--json")
    (orders,) = status["pipelines"]
    newest = spark_history[-1]
    assert orders["name"] == "orders" and orders["problem"] is None and orders["lag"] == 0, orders
    assert orders["last_batch"].startswith(f"#{newest.batch_id} "), orders
    assert {(p["topic"], p["partition"]): p["next_offset"] for p in orders["partitions"]} == newest.ends()
    # Each table's shape: the ledger holds one small file and one version per batch.
    ledger = orders["tables"]["ledger"]
    assert (ledger["version"], ledger["files"], ledger["oldest_readable_version"]) == (len(spark_history) - 1,
                                                                                      len(spark_history), 0)
    assert ledger["mean_file_bytes"] == ledger["bytes"] // ledger["files"] > 0
    assert orders["tables"]["target"]["files"] >= len(spark_history) and orders["maintained"] == "never"
    assert "quarantine" not in orders["tables"]  # no bad records, no table

    shown = _run("offsets", "show", "orders", "--config", str(path), "--last", "2", "--json")
    assert shown["newest_batch"] == newest.batch_id
    assert [b["batch"] for b in shown["batches"]] == [i.batch_id for i in spark_history[-2:]]
    assert [b["offsets"] for b in shown["batches"]] == [sum(r.span for r in i.ranges) for i in spark_history[-2:]]
    assert all(p["lag"] == 0 for p in shown["partitions"]), shown
