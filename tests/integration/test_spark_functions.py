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
    assert not disagree, "\n".join(map(repr, disagree[:10]))
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
    # Invalid UTF-8 is quarantined before any parse (tidemark_is_valid_utf8); the new values leave it out.
    plain = [v for v in _plain_json_edge() + _plain_json_values(rng) if _python_valid(v)]
    values = [(v,) for v in edge + randoms + plain] + [(None,)]
    df = spark.createDataFrame(values, "value BINARY").withColumn("s", F.col("value").cast("string"))
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_bad"}
    theirs = F.from_json("s", ddl, options)
    mine = F.call_function("tidemark_from_json", F.col("s"), F.lit(ddl), F.lit("_bad"))
    # With a utf8 column (pipelines.transform), the same row and the column true only where PlainJson read it.
    flagged = F.call_function("tidemark_from_json", F.col("s"), F.lit(ddl + ", _ok BOOLEAN"), F.lit("_bad"),
                              F.lit("_ok"))
    # Given the bytes themselves (as the ingest does), the same answers.
    from_bytes = F.call_function("tidemark_from_json", F.col("value"), F.lit(ddl), F.lit("_bad"))
    rows = df.select(
        "value", F.to_json(F.struct(theirs.alias("p"))).alias("spark"), F.to_json(F.struct(mine.alias("p"))).alias("ours"),
        theirs["_bad"].alias("spark_bad"), mine["_bad"].alias("ours_bad"), flagged["_ok"].alias("ok"),
        F.to_json(F.struct(flagged.dropFields("_ok").alias("p"))).alias("flagged"),
        F.to_json(F.struct(from_bytes.alias("p"))).alias("from_bytes")).collect()
    assert all(r.flagged == r.ours for r in rows)
    assert all(r.from_bytes == r.ours for r in rows)
    assert all(r.ok is None or (r.ok and _python_valid(bytes(r.value))) for r in rows)
    assert sum(1 for r in rows if r.ok) > 1000
    # A corrupt record is quarantined whole (pipelines.transform), so of two corrupt answers only the
    # corrupt text is compared: Jackson's byte and char parsers keep different partial results after an
    # error inside an array, which no table ever holds.
    disagree = [(bytes(r.value) if r.value is not None else None, r.spark, r.ours) for r in rows
                if (r.spark_bad != r.ours_bad if r.spark_bad is not None and r.ours_bad is not None
                    else r.spark != r.ours)]
    assert not disagree, "\n".join(map(repr, disagree[:10]))
    parsed = sum(1 for r in rows if r.ours not in ('{}', '{"p":null}') and '"_bad"' not in r.ours)
    corrupt = sum(1 for r in rows if '"_bad"' in r.ours)
    assert parsed > 500 and corrupt > 1000, (parsed, corrupt)  # both kinds of answer were compared
    assert spark.range(1).select(F.call_function("tidemark_from_json", F.lit('{"id": "x"}'), F.lit(ddl), F.lit("_bad"))
                                 .alias("p")).first().p.id == "x"


def test_json_parse_of_a_value_inside_its_row_reads_nothing_after_it(spark) -> None:  # type: ignore[no-untyped-def]
    """tidemark_from_json reads a binary value where it lies in the input row, whose next field's
    bytes follow it: a value cut short must not be completed by them (a cut at a multiple of 8
    bytes leaves no padding between the two), nor a whole one lengthened."""
    from pyspark.sql import functions as F

    ddl = ("id STRING, n BIGINT, x DOUBLE, ok BOOLEAN, tags ARRAY<STRING>, inner STRUCT<a: INT, b: STRING>, "
           "d ARRAY<DOUBLE>, _bad STRING")
    # The first five end a number's exponent where the cut falls (found by review: a parse that
    # took the next field's digits as the exponent's failed the task instead of handing back).
    texts = [b'{"x": 1e5}', b'{"x": 1e+5}', b'{"x":-1E-2}', b'{"d":[1e3]}', b'{"x": 1.5}',
             b'{"id": "abcdefgh", "n": 1234567, "x": 1.5, "ok": true, "tags": ["p", "q"], "inner": {"a": 1, "b": "z"}}',
             '{"id": "Zo\\u00eb \\ud83d\\ude00 é✓😀", "x": -2.5e3, "ok": false, "other": [1, {"k": null}]}'.encode(),
             b'{"n": 1}', b'{"id": "x"}    ', b'{"tags": []}    ']
    rows = [(t[:cut], t[cut:]) for t in texts for cut in range(8, len(t) + 1, 8)]
    assert any(b"{" in tail for _, tail in rows) and any(value in texts for value, _ in rows)
    df = spark.createDataFrame(rows, "value BINARY, tail BINARY").repartition(1)  # rows as Spark's own, UnsafeRow
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_bad"}
    got = df.select("value", "tail", F.to_json(F.struct(F.from_json(F.col("value").cast("string"), ddl, options)
                                                        .alias("p"))).alias("spark"),
                    F.to_json(F.struct(F.call_function("tidemark_from_json", F.col("value"), F.lit(ddl), F.lit("_bad"))
                                       .alias("p"))).alias("ours")).collect()
    assert len(got) == len(rows)
    wrong = [(bytes(r.value), bytes(r.tail), r.spark, r.ours) for r in got if r.spark != r.ours]
    assert not wrong, "\n".join(map(repr, wrong[:10]))
    assert sum(1 for r in got if '"_bad"' in r.ours) > 10  # the cut values were read, and refused
    # Cut at every byte, each alone in its array: a read past the end throws there. The reader then
    # hands the record to Spark's parser rather than fail the task, and counts it: no read may.
    plain = spark._jvm.io.tidemark.spark.PlainJson
    for text in [*texts, *(v for v in _plain_json_edge() if len(v) < 200)]:
        for cut in range(len(text) + 1):
            plain.answers(ddl, "_bad", bytearray(text[:cut]))
    assert plain.unforeseen() == 0


def _plain_json_edge() -> list[bytes]:
    """Values at the edges of what PlainJson reads itself (infra/java): each either read exactly or handed back."""
    deep = b'{"other": ' + b"[" * 70 + b"]" * 70 + b', "id": "deep"}'
    many = b"{" + b", ".join(b'"k%d": %d' % (i, i) for i in range(300)) + b', "id": "many"}'
    return [
        b'{"x": -0}', b'{"x": -0.0}', b'{"x": 0}', b'{"x": 0.0}', b'{"x": 1E2}', b'{"x": 1e-400}', b'{"x": -1e400}',
        b'{"x": 12345678901234567890}', b'{"x": 9007199254740993}', b'{"x": 0.1}', b'{"x": 01}', b'{"x": 1.}',
        b'{"x": .5}', b'{"x": -}', b'{"x": +1}', b'{"x": NaN}', b'{"x": -Infinity}', b'{"x": 1x}', b'{"x": 2.5e+3}',
        b'{"n": 9223372036854775807}', b'{"n": -9223372036854775808}', b'{"n": -9223372036854775809}',
        b'{"n": 1.0}', b'{"n": 1e2}', b'{"n": -0}', b'{"n": 007}', b'{"n": true}',
        b'{"inner": {"a": 2147483647}}', b'{"inner": {"a": 2147483648}}', b'{"inner": {"a": -2147483648}}',
        b'{"inner": {"a": -2147483649}}', b'{"inner": {"b": "x", "b": "y"}}', b'{"inner": {"A": 1}}',
        b'{"id": "\\u0000"}', b'{"id": "\\ud83d"}', b'{"id": "\\ude00"}', b'{"id": "\\ud83d\\u0041"}',
        b'{"id": "\\ud83d\\ude00 pair"}', b'{"id": "\\x"}', b'{"id": "\\/\\b\\f\\n\\r\\t\\"\\\\"}',
        b'{"id": "\\u00E9\\u00e9"}', b'{"id": "\\u12"}', b'{"id": "\xc0\x80 overlong"}',
        b'{"id": "\xed\xa0\x80 surrogate"}', b'{"id": "\xf4\x90\x80\x80 too high"}', b'{"id": "\x7f del"}',
        b'{"id": "\xe2\x9c"}', b'{"id": "\xe2\x9c\x93 check"}', b'{"id": "\xf0\x9f\x98\x80"}',
        b'{"i\\u0064": "escaped key"}', b'{"\xc3\xa9": 1, "id": "non-ascii key"}', b'{"\xc3": 1}',
        b'{"Id": "x", "id": "y"}', b'{"id": "y", "Id": "x"}', b'{"id": "a", "other": {"deep": [1, {"x": [true, false, null]}]}}',
        b'{"other": [1, 2,]}', b'{"other": tru}', b'{"other": "\x01"}', b'{"other": {"a": 1,}}', b'{"other": {,}}',
        b'{"other": 1, }', b'{, "id": "x"}', b'{"id" : "spaces" , "n" : 1 }', b'{"id":"tight","n":-7,"ok":false}',
        b'\r\n{"id": "crlf"}\r\n', b'{"tags": [null, "a"]}', b'{"tags": []}', b'{"tags": [ ]}', b'{"tags": [1]}',
        b'{"tags": ["a",]}', b'{"tags": ["a" "b"]}', b'{"tags": null}', b'{"inner": null}', b'{"inner": {}}',
        b'{"ok": null}', b'{"id": null}', b'{"ok": True}', b'{"id": "a"', b'{"id"', b'{', b'{"id": "a",', deep, many,
        b'{"other": ' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"at": null, "d": null, "m": null, "id": "nulls"}',
        b'{"id": "' + b"long " * 5000 + b'"}',
    ]


def _plain_json_values(rng: random.Random) -> list[bytes]:
    """JSON objects of the fields PlainJson reads (infra/java), some mutated by a byte: most read there, all compared."""
    text = "aé✓😀\"\\\n\t\x01\x7f/ x\u2028"
    scalars = {"id": lambda: "".join(rng.choice(text) if rng.random() < 0.2 else "a" for _ in range(rng.randint(0, 40))),
               "n": lambda: rng.choice([rng.randint(-10**6, 10**6), rng.randint(-2**63, 2**63 - 1), 0]),
               "x": lambda: rng.choice([rng.uniform(-1e6, 1e6), rng.randint(-10**20, 10**20), 0.0, -0.0, 1e-300]),
               "ok": lambda: rng.choice([True, False, None]),
               "tags": lambda: [rng.choice(["p", "é", None, "\\q"]) for _ in range(rng.randint(0, 3))],
               "inner": lambda: {"a": rng.randint(-2**31, 2**31 - 1), "b": rng.choice(["z", None, "\u00e9"])},
               "other": lambda: rng.choice([[1, {"y": [None, "s"]}], "t", 2.5, {}])}
    values = []
    for i in range(2000):
        record = {f: make() for f, make in rng.sample(sorted(scalars.items()), rng.randint(0, len(scalars)))}
        value = json.dumps(record, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
        raw = value.encode()
        if i % 2:  # one byte inserted, deleted or replaced
            at = rng.randrange(len(raw) + 1)
            byte = bytes([rng.choice(b'{}[]",: \\-.e0123456789tfnu\x80\xc3')])
            raw = rng.choice([raw[:at] + byte + raw[at:], raw[:at] + raw[at + 1:], raw[:at] + byte + raw[at + 1:]])
        values.append(raw)
    for _ in range(1000):  # numbers of every length, as text: the exact short-number path and Java's parse
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 19))).lstrip("0") or "0"
        sign = rng.choice(["", "-"])
        point = rng.randrange(len(digits))
        decimal = digits[:point] + "." + digits[point:] if point else "0." + digits
        x = rng.choice([digits, decimal])
        values.append(f'{{"n": {sign}{digits[:18]}, "x": {sign}{x}, "inner": {{"a": {sign}{digits[:9]}}}}}'.encode())
    return values


def test_plain_json_reads_ordinary_records_itself_and_hands_back_what_it_cannot_be_sure_of(spark) -> None:  # type: ignore[no-untyped-def]
    """The comparison above is with from_json's answers; this says which of them PlainJson gave, not Jackson."""
    ddl = "id STRING, n BIGINT, x DOUBLE, ok BOOLEAN, tags ARRAY<STRING>, inner STRUCT<a: INT, b: STRING>, _bad STRING"
    plain = spark._jvm.io.tidemark.spark.PlainJson

    def answers(value: bytes) -> bool:
        return bool(plain.answers(ddl, "_bad", bytearray(value)))

    rng = random.Random(11)
    ordinary = [json.dumps({"id": f"o-{i}", "n": rng.randint(-2**63, 2**63 - 1), "x": rng.uniform(-1e9, 1e9),
                            "ok": i % 2 == 0, "tags": ["a", "é\n"], "inner": {"a": i, "b": "😀"}, "other": [1]},
                           ensure_ascii=i % 2 == 0).encode() for i in range(200)]
    assert all(answers(v) for v in ordinary)
    assert answers(b'  {"id": "x"}  ') and answers(b"{}") and answers(b'{"x": -0}')
    for unsure in [b'{"id": "a", "id": "b"}', b'{"i\\u0064": "x"}', b'{"id": "a"} trailing', b'{"ID": "x"}',
                   b'{"n": 1.5}', b'{"n": 9223372036854775808}', b'{"id": 1}', b'{"x": "1"}', b'{"x": NaN}',
                   b'{"id": "\\ud83d"}', b'{"id": "\xc0\x80"}', b"{'id': 'x'}", b'{"id": "\x01"}', b"[]",
                   b'{"inner": {"a": 2147483648}}']:
        assert not answers(unsure), unsure


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

    def txn(*more):  # type: ignore[no-untyped-def]
        read = call(F.array(pair("txid", "7"), pair("lsn", "0/A"), pair("position", " 1 "), *more), F.lit("Lt"),
                    *names)[0][0]
        return read["txn"].asDict() if read["txn"] is not None else None

    # An unreadable size: not a transaction's event (its own). Without counts, every event expected here;
    # with them in the relay's form, this pipeline's; in another form, the fallback's answer (0 here).
    assert txn(pair("size", "x")) is None
    assert txn(pair("size", "3")) == {"id": "0/A/7", "position": 1, "size": 3, "expected": 3, "released": False}
    assert txn(pair("size", "3"), pair("counts", '{"t":2,"u":1}'))["expected"] == 2
    assert txn(pair("size", "3"), pair("counts", '{"t": 2}'))["expected"] == 0
    headers = F.array(pair("txid", "7"), pair("lsn", "0/A"), pair("position", " 1 "), pair("size", "x"))
    # The event id's header, when named, in the same pass: the first value, as text.
    assert call(F.array(pair("id", "e-1"), pair("txid", "7"), pair("id", "e-2")), F.lit("Lt"), *names,
                F.lit("id"))[0][0].asDict() == {"txn": None, "source": None, "event": "e-1"}
    # A header that is also a transaction header fills both fields; a null first value is the answer.
    assert call(headers, F.lit("Lt"), *names, F.lit("txid"))[0][0].asDict()["event"] == "7"
    null_first = F.array(F.struct(F.lit("id").alias("key"), F.lit(None).cast("binary").alias("value")),
                         pair("id", "x"), pair("txid", "7"))
    assert call(null_first, F.lit("Lt"), *names, F.lit("id"))[0][0].asDict()["event"] is None
    with pytest.raises(AnalysisException, match="the headers must be Kafka's"):
        call(F.array(F.lit("txid")), F.lit("Lt"), *names)
    with pytest.raises(IllegalArgumentException, match="must be a constant string"):
        call(headers, F.col("id").cast("string"), *names)
    with pytest.raises(IllegalArgumentException, match="9 or 10 arguments"):
        call(headers, F.lit("Lt"), F.lit("txid"))


def test_the_driver_jvm_compiles_with_tidemarks_jit_thresholds(spark) -> None:  # type: ignore[no-untyped-def]
    """infra.spark.JIT_OPTIONS reaches HotSpot: the driver's own value of each flag, not the text of the conf."""
    from infra.spark import JIT_OPTIONS

    jvm = spark.sparkContext._jvm
    diagnostic = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    for option in JIT_OPTIONS.split():
        name, value = option.removeprefix("-XX:").split("=")
        held = diagnostic.getVMOption(name)
        assert float(held.getValue()) == float(value), f"{name}: {held.getValue()}"
        assert str(held.getOrigin()) == "VM_CREATION"


def test_avro_direct_decode_gives_from_avros_rows_and_reasons(spark) -> None:  # type: ignore[no-untyped-def]
    """``tidemark_from_avro`` against Spark's ``from_avro`` (one branch per writer id) on the same
    framed values: three writer versions into one reader, random records of every type the
    direct decoder takes, and values that do not decode."""
    import datetime as dt
    import decimal

    from pyspark.sql import functions as F

    from pipelines.avro import (
        DECODED,
        _direct_columns,
        _from_avro_columns,
        direct,
        reader_with_marker,
    )
    from pipelines.subjects import DECODE_ERROR
    from tests.avro_helpers import framed

    line = {"type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"},
                                                         {"name": "qty", "type": "int"}]}
    base = [{"name": "id", "type": "int"}, {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "ok", "type": "boolean"}, {"name": "ratio", "type": "float"}, {"name": "amount", "type": "double"},
            {"name": "blob", "type": "bytes"},
            {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
            {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 3}},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "at_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
            {"name": "lines", "type": {"type": "array", "items": line}},
            {"name": "counts", "type": {"type": "map", "values": "long"}}]
    v1 = {"type": "record", "name": "Order", "fields": base}
    v2 = {**v1, "fields": [*base, {"name": "channel", "type": "string", "default": "web"}]}
    v3 = {**v2, "fields": [{"name": "id", "type": "long"}, *v2["fields"][1:]]}
    assert direct(v3)
    rng = random.Random(7)

    def record(i: int) -> dict[str, object]:
        return {"id": i, "note": rng.choice([None, "", "é" * rng.randrange(5)]), "ok": rng.random() < 0.5,
                "ratio": rng.random(), "amount": rng.uniform(-1e6, 1e6), "blob": rng.randbytes(rng.randrange(4)),
                "state": rng.choice(["NEW", "PAID"]), "tag": rng.randbytes(3),
                "price": decimal.Decimal(rng.randrange(-10**9, 10**9)) / 100,
                "day": dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(-900, 900)),
                "at": dt.datetime(2026, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=rng.randrange(10**9)),
                "at_us": rng.choice([None, dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=7)]),
                "lines": [{"sku": f"s{j}", "qty": j} for j in range(rng.randrange(3))],
                "counts": {f"k{j}": rng.randrange(-5, 5) for j in range(rng.randrange(3))}}

    versions = {11: v1, 12: v2, 13: v3}
    values = []
    for i in range(600):
        schema_id = rng.choice(list(versions))
        extra = {"channel": "app"} if schema_id != 11 else {}
        values.append(framed(schema_id, versions[schema_id], {**record(i), **extra}))
    good = values[-1]
    values += [b"\x01" + good[1:], good[:9], b"\x00\x00", framed(99, v3, {**record(0), "channel": "x"}), None]
    writers = {i: json.dumps(s) for i, s in versions.items()}
    reader = json.dumps(v3)
    frame = spark.createDataFrame([(v,) for v in values], "value BINARY")
    direct_parsed, direct_error = _direct_columns(spark, reader, writers, "orders-value")
    value = F.col("value")
    is_framed = (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(bytearray(b"\x00")))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
    spark_parsed, spark_error = _from_avro_columns(reader_with_marker(reader), writers, "orders-value", is_framed,
                                                   schema_id)
    rows = frame.select(direct_parsed.alias("ours"), direct_error.alias("our_error"),
                        spark_parsed.alias("spark"), spark_error.alias("spark_error")).collect()
    fields = [f["name"] for f in v3["fields"]]
    decoded = 0
    for row, given in zip(rows, values, strict=True):
        assert (row.our_error is None) == (row.spark_error is None), (given, row.our_error, row.spark_error)
        if row.spark_error is not None:
            # The same reason, but for the decoder's own account of a body that does not decode.
            assert row.our_error.split(":")[0] == row.spark_error.split(":")[0], (row.our_error, row.spark_error)
            continue
        ours = row.ours.asDict(recursive=True)
        theirs = row.spark.asDict(recursive=True)
        assert {k: ours[k] for k in fields} == {k: theirs[k] for k in fields}, given
        assert ours[DECODE_ERROR] is None and theirs[DECODED] is True
        decoded += 1
    assert decoded == 600 and rows[-1].our_error == "tombstone: null value"


_PROTO_WRITER = '''syntax = "proto3";
package t;
enum Kind { A = 0; B = 1; C = 2; }
message Inner { string s = 1; repeated int32 xs = 2; Kind k = 3; }
message Rec {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10; float fl = 11; double db = 12;
  bool b = 13; string str = 14; bytes by = 15; Kind kind = 16; optional string opt = 17; Inner inner = 18;
  repeated int64 packed = 19; repeated int32 unpacked = 20 [packed = false]; repeated string names = 21;
  repeated Inner inners = 22; map<string, Inner> by_key = 23; map<int32, double> scores = 24;
  string only_writer = 25;
}
'''
# The reader: field 25 dropped, field 26 added (the writer lacks it), i32 widened to int64.
_PROTO_READER = _PROTO_WRITER.replace("int32 i32 = 1;", "int64 i32 = 1;").replace(
    "string only_writer = 25;", "int32 only_reader = 26; optional int32 only_reader_opt = 27;")


def test_protobuf_wire_decode_gives_what_protobuf_itself_parses(spark) -> None:  # type: ignore[no-untyped-def]
    """``tidemark_from_protobuf`` against Python's protobuf parsing the same writer bytes with the
    reader's message (how Protobuf resolves versions): random records of every scalar kind,
    packed and unpacked repeated fields, maps, nested and repeated messages, an optional field,
    a message sent twice (merged), fields only one side has, and bodies that do not parse."""
    from google.protobuf import message_factory
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from connectors.protobuf_schemas import compile_schema, frame, message
    from pipelines.protobuf import columns
    from pipelines.subjects import DECODE_ERROR as ERROR

    writer_set, reader_set = compile_schema(_PROTO_WRITER, "w"), compile_schema(_PROTO_READER, "r")
    Writer = message_factory.GetMessageClass(message(writer_set, "t.Rec", "w"))
    reader_descriptor = message(reader_set, "t.Rec", "r")
    Reader = message_factory.GetMessageClass(reader_descriptor)
    rng = random.Random(3)

    def inner() -> dict[str, object]:
        return {"s": rng.choice(["", "x", "é✓"]), "xs": [rng.randrange(-9, 9) for _ in range(rng.randrange(3))],
                "k": rng.randrange(3)}

    def record() -> dict[str, object]:
        fields: dict[str, object] = {
            "i32": rng.randrange(-2**31, 2**31), "i64": rng.randrange(-2**63, 2**63), "u32": rng.randrange(2**32),
            "u64": rng.randrange(2**64), "s32": rng.randrange(-2**31, 2**31), "s64": rng.randrange(-2**63, 2**63),
            "f32": rng.randrange(2**32), "f64": rng.randrange(2**64), "sf32": rng.randrange(-2**31, 2**31),
            "sf64": rng.randrange(-2**63, 2**63), "fl": rng.choice([0.0, 1.5, -2.25]), "db": rng.uniform(-1e9, 1e9),
            "b": rng.random() < 0.5, "str": rng.choice(["", "plain", "Zoë 😀"]), "by": rng.randbytes(rng.randrange(4)),
            "kind": rng.randrange(3), "packed": [rng.randrange(-2**40, 2**40) for _ in range(rng.randrange(4))],
            "unpacked": [rng.randrange(-99, 99) for _ in range(rng.randrange(4))],
            "names": [rng.choice(["a", "b"]) for _ in range(rng.randrange(3))],
            "inners": [inner() for _ in range(rng.randrange(3))],
            "by_key": {rng.choice("pqr"): inner() for _ in range(rng.randrange(3))},
            "scores": {rng.randrange(5): rng.random() for _ in range(rng.randrange(3))},
            "only_writer": "dropped"}
        for optional in ("opt", "inner"):
            if rng.random() < 0.5:
                fields[optional] = "set" if optional == "opt" else inner()
        return {k: v for k, v in fields.items() if rng.random() < 0.85}  # some left at their defaults

    bodies = []
    for _ in range(400):
        fields = record()
        inners, by_key = fields.pop("inners", []), fields.pop("by_key", {})
        built = Writer(**{k: v for k, v in fields.items() if k not in ("inner",)})
        if "inner" in fields:
            built.inner.CopyFrom(built.inner.__class__(**fields["inner"]))  # type: ignore[arg-type]
        for item in inners:  # type: ignore[attr-defined]
            built.inners.add(**item)
        for key, item in by_key.items():  # type: ignore[attr-defined]
            built.by_key[key].CopyFrom(built.by_key[key].__class__(**item))
        body = built.SerializeToString()
        if rng.random() < 0.1:  # the same message twice in a row: Protobuf merges them
            body += Writer(inner=built.inner.__class__(s="again", xs=[7]), names=["more"]).SerializeToString()
        bodies.append(body)
    values = [frame(5, [1], b) for b in bodies]  # t.Rec is the file's second message
    # A truncated varint, a string longer than the body, a varint field sent length-delimited,
    # and a string field (14) that is not UTF-8.
    bad = [frame(5, [1], b"\x08\xff"), frame(5, [1], b"\x72\x05ab"), frame(5, [1], b"\x0a\x01a"),
           frame(5, [1], b"\x72\x01\xff")]
    values += bad

    payload = columns(reader_descriptor)
    result = StructType([*payload.fields, StructField(ERROR, StringType())])
    writers = F.create_map(F.lit(5), F.lit(bytearray(writer_set)), F.lit(6), F.lit(bytearray(reader_set)))
    parsed = F.call_function("tidemark_from_protobuf", F.col("value"), writers, F.lit("t.Rec"), F.lit(6),
                             F.lit("t-value"), F.lit(result.json()))
    rows = spark.createDataFrame([(v,) for v in values], "value BINARY").select(parsed.alias("p")).collect()

    def expected(body: bytes) -> dict[str, object]:
        read = Reader.FromString(body)

        def value(field, item):  # type: ignore[no-untyped-def]
            if field.message_type is not None:
                return {f.name: convert(f, item) for f in field.message_type.fields}
            if field.enum_type is not None:
                named = field.enum_type.values_by_number.get(item)
                return named.name if named is not None else str(item)
            if field.type == field.TYPE_UINT64 or field.type == field.TYPE_FIXED64:
                return item - 2**64 if item >= 2**63 else item
            return item

        def convert(field, owner):  # type: ignore[no-untyped-def]
            held = getattr(owner, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                return {k: (value(value_field, v) if value_field.message_type is None
                            else {f.name: convert(f, v) for f in value_field.message_type.fields})
                        for k, v in held.items()}
            if field.is_repeated:
                return [value(field, item) for item in held]
            if field.has_presence and not owner.HasField(field.name):
                return None
            return value(field, held)

        return {f.name: convert(f, read) for f in reader_descriptor.fields}

    for row, body in zip(rows, bodies, strict=False):
        got = row.p.asDict(recursive=True)
        assert got.pop(ERROR) is None
        want = expected(body)
        for name in ("fl",):  # a float column: compare as floats
            assert abs(got.pop(name) - want.pop(name)) < 1e-6
        assert got == want, body.hex()
    reasons = [row.p[ERROR] for row in rows[len(bodies):]]
    assert all(r is not None and r.startswith("value does not decode as Protobuf with schema id 5") for r in reasons), \
        reasons
