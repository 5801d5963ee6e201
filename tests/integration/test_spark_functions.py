"""Tidemark's JVM functions agree with Spark's built-ins (infra/java, infra/udfs.py)."""

from __future__ import annotations

import random


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
