"""SIGKILL the ingest process at every named step of the commit protocol, then restart it.

After each crash and restart the table must hold exactly the read_committed records of
the topic: nothing missing, nothing twice. The crash is real (the process kills itself
with SIGKILL at the step, exit status -9 is asserted), and so are Kafka, Spark and Delta.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from offsets.protocol import CRASH_POINTS
from tests.kafka_helpers import read_all, transactional_producer, write_transaction

pytestmark = pytest.mark.slow


def _ingest(config: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_CRASH_AT"}
    if crash_at:
        env["TIDEMARK_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "tidemark.cli", "ingest", "orders", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def test_exactly_once_after_sigkill_at_every_step(spark, kafka_bootstrap: str, topic_factory,  # type: ignore[no-untyped-def]
                                                  tmp_path: Path) -> None:
    topic = topic_factory("crash", partitions=3)
    target = tmp_path / "orders"
    config = tmp_path / "tidemark.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "pipelines": [{"name": "orders", "topics": [topic], "target": str(target),
                       "schema": "id INT, note STRING", "max_records_per_batch": 40}],
    }))
    producer = transactional_producer(kafka_bootstrap)
    serial = 0
    for point in CRASH_POINTS:
        for t in range(5):  # one transaction in five aborts
            values = [json.dumps({"id": serial + i, "note": point}).encode() for i in range(12)]
            write_transaction(producer, topic, values, commit=t != 2)
            serial += 12
        crashed = _ingest(config, point)
        assert crashed.returncode == -9, f"no crash at {point}: {crashed.stderr[-2000:]}"
        restarted = _ingest(config, None)
        assert restarted.returncode == 0, restarted.stderr[-2000:]

    rows = spark.read.format("delta").load(str(target)).select(
        "_kafka_topic", "_kafka_partition", "_kafka_offset", "id").collect()
    in_table = sorted((r[0], r[1], r[2]) for r in rows)
    in_kafka = sorted((topic, r.partition, r.offset) for r in read_all(kafka_bootstrap, topic))
    assert len(in_table) == len(set(in_table)), "a record was written twice"
    assert in_table == in_kafka
    assert len(in_kafka) == len(CRASH_POINTS) * 4 * 12
    assert len({r.id for r in rows}) == len(rows)
