"""The Spark driver's log configuration, loaded by log4j itself in the tests' driver JVM.

A second log4j context, built from the very file ``infra.spark`` writes for the CLI,
beside the session's own (which it leaves alone): what it drops and how its file rolls
over are log4j's reading of our configuration, not ours.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from infra.spark import _log4j2
from tidemark.logs import ROTATE_KEEP

#: What Spark's Kafka source logs at every read that names a group (Spark 4.1's text).
GROUP_ID_WARNING = ("Kafka option 'kafka.group.id' has been set on this query, it is\n"
                    " not recommended to set this option. This option is unsafe to use since multiple concurrent")


def _context(spark, config: Path):  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    uri = jvm.java.io.File(str(config)).toURI()
    context = jvm.org.apache.logging.log4j.core.LoggerContext(f"tidemark-test-{config.parent.name}", None, uri)
    context.start()
    return context


def test_the_cli_drivers_log_drops_the_group_id_warning_and_rolls_over(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TIDEMARK_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("TIDEMARK_VERBOSE", raising=False)
    config = _log4j2(rotate_bytes=4096)
    assert config.parent == tmp_path
    context = _context(spark, config)
    try:
        other = context.getLogger("org.apache.spark.scheduler.DAGScheduler")
        for i in range(200):  # ~30 KB: seven rollovers at 4 KB, of which the last three files are kept
            other.warn(f"line {i:03d} " + "x" * 100)
        kafka = context.getLogger("org.apache.spark.sql.kafka010.KafkaSourceProvider")
        kafka.warn(GROUP_ID_WARNING)
        kafka.warn("another warning of the Kafka source stays")
    finally:
        context.stop()
    logs = sorted(p.name for p in tmp_path.glob("spark.log*"))
    assert logs == ["spark.log", *(f"spark.log.{i}" for i in range(1, ROTATE_KEEP + 1))], logs
    text = {name: (tmp_path / name).read_text() for name in logs}
    assert all(len(t.encode()) <= 4096 + 200 for t in text.values()), {n: len(t) for n, t in text.items()}
    last = [max(map(int, re.findall(r"line (\d{3})", text[name])), default=-1) for name in logs[1:]]
    assert "line 199" in text["spark.log"] and all(a > b for a, b in itertools.pairwise(last)), last  # .1 the newest
    every = "".join(text.values())
    assert "line 000" not in every  # the oldest files went
    assert "kafka.group.id" not in every
    assert "WARN KafkaSourceProvider: another warning of the Kafka source stays" in every


def test_the_shipped_loggers_drop_the_group_id_warning_only(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # The CLI's file configuration carries the shipped loggers and filters as they are.
    monkeypatch.setenv("TIDEMARK_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("TIDEMARK_VERBOSE", raising=False)
    context = _context(spark, _log4j2())
    try:
        kafka = context.getLogger("org.apache.spark.sql.kafka010.KafkaSourceProvider")
        kafka.warn(GROUP_ID_WARNING)
        kafka.warn("Option groupIdPrefix will be ignored as option kafka.group.id has been set.")
        context.getLogger("org.apache.spark.util.SparkStringUtils").warn("Truncated the string representation")
    finally:
        context.stop()
    text = (tmp_path / "spark.log").read_text()
    assert "has been set on this query" not in text
    assert "Option groupIdPrefix will be ignored" in text
    assert "Truncated" not in text
