"""Tidemark's JVM classes agree with Spark's and Delta's built-ins (infra/java, infra/udfs.py)."""

from __future__ import annotations

import random

import pytest


def test_utf8_validator_agrees_with_spark_on_edge_cases_and_random_bytes(spark) -> None:  # type: ignore[no-untyped-def]
    edge = [b"", b"ascii only, longer than eight bytes", "Zoë ✓ 😀".encode(), b"\x80", b"\xc0\xaf", b"\xc2\xa9",
            b"\xe0\x80\xaf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbd", b"\xf0\x8f\xbf\xbf",
            b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff",
            b"12345678\xe2\x82", b"1234567\xe2\x82\xac", b"abcdefgh" * 3 + b"\xc3", "é".encode() * 9]
    rng = random.Random(5)
    alphabet = [b"a", b"\x00", b"\x7f", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\x80", b"\xbf", b"\xc3",
                b"\xe2\x82", b"\xed\xa0\x80", b"\xf8", b"\xff"]
    randoms = [b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    randoms += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 24))) for _ in range(3000)]
    values = [(v,) for v in edge + randoms] + [(None,)]
    df = spark.createDataFrame(values, "value BINARY")
    rows = df.selectExpr("value", "is_valid_utf8(value) AS spark", "tidemark_is_valid_utf8(value) AS ours").collect()
    disagree = [(bytes(r.value) if r.value is not None else None, r.spark, r.ours) for r in rows if r.spark != r.ours]
    assert not disagree, disagree[:10]
    python = [r.ours for r in rows[: len(edge)]]
    assert python == [_python_valid(v) for v in edge]  # and both agree with Python's strict decoder
    assert sum(1 for r in rows if r.ours) > 200 and sum(1 for r in rows if r.ours is False) > 2000  # both kinds


def _python_valid(value: bytes) -> bool:
    try:
        value.decode("utf-8", errors="strict")
        return True
    except UnicodeDecodeError:
        return False


def test_local_log_store_lists_what_delta_lists_and_is_the_one_delta_uses(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from py4j.protocol import Py4JJavaError

    from infra.spark import LOG_STORE

    jvm = spark._jvm
    table = tmp_path / "a table"  # a space: the directory is found from the path's URI
    for i in range(12):  # a checkpoint at 10, Delta's checksums, Hadoop's hidden .crc files
        spark.range(i, i + 1).write.format("delta").mode("append").save(str(table))
    log = table / "_delta_log"
    (log / "_staged_commits").mkdir(exist_ok=True)  # a directory after the commits sorts in too
    conf = spark._jsc.hadoopConfiguration()
    ours = getattr(jvm, LOG_STORE)(conf)
    stock = jvm.io.delta.storage.HDFSLogStore(conf)

    def listing(store, start: str) -> list[tuple[str, int, int, bool]]:  # type: ignore[no-untyped-def]
        it = store.listFrom(jvm.org.apache.hadoop.fs.Path(f"file:{log}/{start}"), conf)
        out = []
        while it.hasNext():
            s = it.next()
            out.append((s.getPath().toString(), s.getLen(), s.getModificationTime(), s.isDirectory()))
        return out

    starts = [f"{v:020d}.json" for v in (0, 5, 10, 11, 12, 99)] + [f"{10:020d}.checkpoint.parquet", ".0", "0", "_"]
    for start in starts:
        assert listing(ours, start) == listing(stock, start), start
    everything = listing(ours, "0")
    names = [p.rsplit("/", 1)[1] for p, *_ in everything]
    assert sum(n.endswith(".json") for n in names) == 12 and any(n.endswith(".crc") for n in names)
    assert not any(n.startswith(".") for n in names) and names == sorted(names)
    assert listing(ours, f"{11:020d}.json")[0][0].endswith(f"{11:020d}.json")

    # An entry deleted between the directory read and its status is left out, not an error.
    it = ours.listFrom(jvm.org.apache.hadoop.fs.Path(f"file:{log}/{5:020d}.json"), conf)
    (log / f"{6:020d}.json").unlink()
    left = []
    while it.hasNext():
        left.append(it.next().getPath().getName())
    assert f"{5:020d}.json" in left and f"{6:020d}.json" not in left and f"{7:020d}.json" in left

    for store in (ours, stock):  # a missing log directory is FileNotFoundException, as Delta expects
        with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
            store.listFrom(jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/none/_delta_log/0"), conf)

    # and the session's Delta lists local tables with it
    delegate = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(tmp_path / "t2")) \
        .store().getDelegate(jvm.org.apache.hadoop.fs.Path(f"file:{log}"))
    impl = delegate.logStoreImpl() if "LogStoreAdaptor" in delegate.getClass().getName() else delegate
    assert impl.getClass().getName() == LOG_STORE
