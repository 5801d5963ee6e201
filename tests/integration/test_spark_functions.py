"""Tidemark's JVM classes agree with Spark's and Delta's built-ins (infra/java, infra/udfs.py)."""

from __future__ import annotations

import json
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


def test_json_parse_from_bytes_gives_from_json_answers(spark) -> None:  # type: ignore[no-untyped-def]
    """tidemark_from_json reads UTF-8 bytes where from_json reads chars: same rows, same corrupt column,
    including values Jackson's byte parser would otherwise take for UTF-16/32 or mis-handle."""
    from pyspark.sql import functions as F

    ddl = ("id STRING, n BIGINT, x DOUBLE, ok BOOLEAN, tags ARRAY<STRING>, inner STRUCT<a: INT, b: STRING>, "
           "m MAP<STRING, INT>, at TIMESTAMP, d DECIMAL(10,2), _bad STRING")
    edge = [b'{"id": "a", "n": 1, "x": 1.5, "ok": true, "tags": ["p", "q"], "inner": {"a": 1, "b": "z"}}',
            '{"id": "Zoë ✓ 😀 \\u00e9\\ud83d\\ude00", "n": -9223372036854775808}'.encode(),
            b'  \n\t{"id": "leading whitespace"}', b'{"n": 9223372036854775808}', b'{"n": "12"}', b'{"x": "NaN"}',
            b'{"x": 1e400}', b'{"ok": "true"}', b'{"tags": "p"}', b'{"inner": [1]}', b'{"m": {"k": 1, "j": "x"}}',
            b'{"at": "2026-11-26T06:00:00Z"}', b'{"at": "not a time"}', b'{"d": 12345678.999}', b'{"d": 1.005}',
            b'{"id": "dup", "id": "second"}', b'{"ID": "case"}', b'{"id": "a"} trailing', b'{"id": "a"}{"id": "b"}',
            b'[{"id": "in an array"}]', b'[{"id": "one"}, {"id": "two"}]', b'[]', b'{}', b'', b' ', b'null', b'1',
            b'"s"', b'{"id": "unterminated', b'{"id": }', b"{'id': 'single quotes'}", b'{"id": "\x01 control"}',
            b'\xef\xbb\xbf{"id": "utf-8 bom"}', '{"id": "utf-16"}'.encode("utf-16-le"),
            '{"id": "utf-16 bom"}'.encode("utf-16"), '{"id": "utf-32"}'.encode("utf-32-be"), b'\x00{"id": 1}',
            b'{\x00"id": 1}', b'{"id": "nul \x00 inside"}', b'{"id": "tab\tinside"}', b'{"id": "a"}\n',
            b'{"id": "deep", "inner": {"a": 1, "b": {"c": [1, [2, {"d": 3}]]}}}', b'{"_bad": "given"}']
    rng = random.Random(7)
    pieces = [b'{', b'}', b'[', b']', b'"id"', b'"n"', b':', b',', b' ', b'1', b'-2.5e3', b'"s\xc3\xa9"', b'true',
              b'null', b'"\\u0041"', b'\\', b'"inner"', b'{"a": 3}']
    randoms = [b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    randoms = [b'{"id": ' + r + b'}' if i % 3 == 0 else r for i, r in enumerate(randoms)]
    scalars = [lambda: rng.randint(-10**19, 10**19), lambda: rng.uniform(-1e6, 1e6), lambda: rng.choice([True, False]),
               lambda: None, lambda: "".join(rng.choice("aé✓😀\"\\\n\t/ x") for _ in range(rng.randint(0, 12))),
               lambda: [rng.randint(0, 9) for _ in range(rng.randint(0, 3))], lambda: {"a": rng.randint(0, 9)}]
    fields = ["id", "n", "x", "ok", "tags", "inner", "m", "at", "d", "other"]
    randoms += [json.dumps({f: rng.choice(scalars)() for f in rng.sample(fields, rng.randint(0, 6))},
                           ensure_ascii=rng.random() < 0.5).encode() for _ in range(2000)]
    values = [(v,) for v in edge + randoms] + [(None,)]
    df = spark.createDataFrame(values, "value BINARY").withColumn("s", F.col("value").cast("string"))
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_bad"}
    rows = df.select(
        "value",
        F.to_json(F.struct(F.from_json("s", ddl, options).alias("p"))).alias("spark"),
        F.to_json(F.struct(F.call_function("tidemark_from_json", F.col("s"), F.lit(ddl), F.lit("_bad")).alias("p")))
        .alias("ours")).collect()
    disagree = [(bytes(r.value) if r.value is not None else None, r.spark, r.ours) for r in rows if r.spark != r.ours]
    assert not disagree, disagree[:10]
    parsed = sum(1 for r in rows if r.ours not in ('{}', '{"p":null}') and '"_bad"' not in r.ours)
    corrupt = sum(1 for r in rows if '"_bad"' in r.ours)
    assert parsed > 500 and corrupt > 1000, (parsed, corrupt)  # both kinds of answer were compared
    assert spark.range(1).select(F.call_function("tidemark_from_json", F.lit('{"id": "x"}'), F.lit(ddl), F.lit("_bad"))
                                 .alias("p")).first().p.id == "x"


def _generated_code(df, capsys) -> list[str]:  # type: ignore[no-untyped-def]
    """The Java source of each of ``df``'s whole-stage-codegen subtrees (without the plan lines)."""
    capsys.readouterr()
    df.explain(mode="codegen")
    printed = capsys.readouterr().out
    return [part.split("== Subtree")[0] for part in printed.split("Generated code:")[1:]]


def test_batch_constant_keeps_a_batchs_values_out_of_the_generated_code(spark, capsys) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from pyspark.errors import IllegalArgumentException
    from pyspark.sql import functions as F

    def batch(batch_id: int, at: datetime, constant: bool):  # type: ignore[no-untyped-def]
        wrap = (lambda c: F.call_function("tidemark_batch_constant", c)) if constant else (lambda c: c)
        return spark.range(3).select("id", wrap(F.lit(batch_id).cast("bigint")).alias("batch_id"),
                                     wrap(F.lit(at).cast("timestamp")).alias("at"))

    first, second = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    inlined = [_generated_code(batch(n, at, False), capsys) for n, at in ((7, first), (8, second))]
    assert inlined[0] and inlined[0] != inlined[1]  # what Spark does alone: each batch its own source
    kept = [_generated_code(batch(n, at, True), capsys) for n, at in ((7, first), (8, second))]
    assert kept[0] and kept[0] == kept[1]
    assert [(r.id, r.batch_id, r.at.astimezone(UTC)) for r in batch(8, second, True).collect()] == [
        (i, 8, second) for i in range(3)]
    with pytest.raises(IllegalArgumentException, match="must be a constant"):
        spark.range(1).select(F.call_function("tidemark_batch_constant", F.col("id"))).collect()


def test_txn_headers_refuses_what_it_cannot_read(spark) -> None:  # type: ignore[no-untyped-def]
    """G3's header reader is called by Tidemark's own code only, but a wrong call still gets a clear error."""
    from pyspark.errors import AnalysisException, IllegalArgumentException
    from pyspark.sql import functions as F

    def call(headers, topics, *rest):  # type: ignore[no-untyped-def]
        return spark.range(1).select(F.call_function("tidemark_txn_headers", headers, topics, F.lit("counts"),
                                                     F.lit(0), *rest)).collect()

    names = [F.lit(n) for n in ("txid", "lsn", "position", "size", "source")]

    def pair(key: str, value: str):  # type: ignore[no-untyped-def]
        return F.struct(F.lit(key).alias("key"), F.lit(value).cast("binary").alias("value"))

    headers = F.array(pair("txid", "7"), pair("lsn", "0/A"), pair("position", " 1 "), pair("size", "x"))
    assert call(headers, F.lit("Lt"), *names)[0][0].asDict() == {
        "id": "0/A/7", "position": 1, "size": None, "source": None, "counted": None}
    with pytest.raises(AnalysisException, match="the headers must be Kafka's"):
        call(F.array(F.lit("txid")), F.lit("Lt"), *names)
    with pytest.raises(IllegalArgumentException, match="must be a constant string"):
        call(headers, F.col("id").cast("string"), *names)
    with pytest.raises(IllegalArgumentException, match="9 arguments"):
        call(headers, F.lit("Lt"), F.lit("txid"))
