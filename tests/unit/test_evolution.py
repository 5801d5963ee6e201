"""Schema evolution's rules (pure logic over Spark's schema types; the writes are proven in
tests/integration/test_schema_evolution.py)."""

from __future__ import annotations

import re

import pytest
from pyspark.sql import types as T

from pipelines.evolution import SchemaConflictError, compare, widens

_SIMPLE = {"TINYINT": T.ByteType(), "SMALLINT": T.ShortType(), "INT": T.IntegerType(), "BIGINT": T.LongType(),
           "FLOAT": T.FloatType(), "DOUBLE": T.DoubleType(), "STRING": T.StringType(), "DATE": T.DateType(),
           "TIMESTAMP": T.TimestampType(), "TIMESTAMP_NTZ": T.TimestampNTZType()}


def _type(text: str) -> T.DataType:
    """A small DDL reader for these tests (Spark's own needs a running session)."""
    text = text.strip()
    if m := re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", text, re.IGNORECASE):
        return T.DecimalType(int(m[1]), int(m[2]))
    if m := re.fullmatch(r"ARRAY<(.*)>", text, re.IGNORECASE):
        return T.ArrayType(_type(m[1]))
    if m := re.fullmatch(r"STRUCT<(.*)>", text, re.IGNORECASE):
        return _schema(m[1].replace(":", " "))
    return _SIMPLE[text.upper()]


def _schema(ddl: str) -> T.StructType:
    fields, depth, start = [], 0, 0
    for i, ch in enumerate(ddl + ","):
        depth += (ch in "<(") - (ch in ">)")
        if ch == "," and depth == 0:
            name, kind = ddl[start:i].strip().split(None, 1)
            fields.append(T.StructField(name, _type(kind)))
            start = i + 1
    return T.StructType(fields)


def _compare(table: str, batch: str, mode: str = "additive", **kw: object):  # type: ignore[no-untyped-def]
    return compare(_schema(table), _schema(batch), mode, pipeline="orders", target="/t", **kw)  # type: ignore[arg-type]


def test_the_same_schema_changes_nothing() -> None:
    change = _compare("id INT, note STRING", "ID int, note string")  # names resolve case-insensitively
    assert not change.alters_table and change.kept == () and change.describe() == "no change"


def test_a_new_field_is_added_and_a_removed_one_kept() -> None:
    change = _compare("id INT, note STRING, old STRING", "id INT, note STRING, extra STRING, s STRUCT<a: INT>")
    assert change.added == ("extra string", "s struct<a:int>")
    assert change.kept == ("old",)
    assert change.alters_table


def test_fields_inside_structs_evolve_like_columns() -> None:
    change = _compare("s STRUCT<a: INT, b: STRING>", "s STRUCT<a: BIGINT, c: DOUBLE>", type_widening="allow")
    assert change.added == ("s.c double",)
    assert change.widened == (("s.a", "int", "bigint"),)
    assert change.kept == ("s.b",)


@pytest.mark.parametrize(("narrow", "wide"), [
    ("TINYINT", "SMALLINT"), ("TINYINT", "BIGINT"), ("SMALLINT", "INT"), ("INT", "BIGINT"),
    ("FLOAT", "DOUBLE"), ("DATE", "TIMESTAMP_NTZ"), ("DECIMAL(10,2)", "DECIMAL(12,2)"),
    ("DECIMAL(10,2)", "DECIMAL(12,4)")])
def test_widenings_delta_makes_by_itself(narrow: str, wide: str) -> None:
    change = _compare(f"v {narrow}", f"v {wide}", type_widening="allow")
    assert [(c, a) for c, a, _ in change.widened] == [("v", _schema(f"v {narrow}").fields[0].dataType.simpleString())]
    # The other way round is an older writer's narrower record: the table keeps its type.
    back = _compare(f"v {wide}", f"v {narrow}")
    assert not back.alters_table and back.widened == ()


@pytest.mark.parametrize(("old", "new", "named"), [
    ("BIGINT", "STRING", "field v is bigint in the table and string in the batch"),
    ("STRING", "INT", "field v is string in the table and int in the batch"),
    ("INT", "DOUBLE", "field v is int in the table and double in the batch"),  # Delta does this by hand only
    ("BIGINT", "DECIMAL(30,0)", "field v is bigint in the table and decimal(30,0) in the batch"),
    ("DECIMAL(10,2)", "DECIMAL(11,4)", "field v is decimal(10,2) in the table and decimal(11,4) in the batch"),
    ("TIMESTAMP", "DATE", "field v is timestamp in the table and date in the batch"),
    ("STRUCT<a: INT>", "STRING", "field v is struct<a:int> in the table and string in the batch"),
    ("ARRAY<INT>", "ARRAY<STRING>", "field v.element is int in the table and string in the batch")])
def test_other_type_changes_stop_naming_the_field_and_both_types(old: str, new: str, named: str) -> None:
    with pytest.raises(SchemaConflictError) as raised:
        _compare(f"id INT, v {old}", f"id INT, v {new}")
    assert named in str(raised.value) and "Nothing was written" in str(raised.value)


def test_a_widening_stops_unless_the_pipeline_opts_in() -> None:
    for table, batch in (("id INT, note STRING", "id BIGINT, note STRING"),
                         ("id INT, s STRUCT<a: FLOAT>", "id INT, s STRUCT<a: DOUBLE>, extra STRING")):
        with pytest.raises(SchemaConflictError) as raised:
            _compare(table, batch)
        said = str(raised.value)
        assert "is int in the table and bigint in the batch" in said or "s.a is float" in said
        assert "Nothing was written" in said and "`type_widening: allow`" in said and "new name" in said
        assert "delta-rs" in said and "delta-spark 4.0" in said
    assert _compare("id INT", "id BIGINT", type_widening="allow").widened == (("id", "int", "bigint"),)
    # A table already wider than the batch needs no opt-in: nothing widens.
    assert not _compare("id BIGINT", "id INT").alters_table


def test_widens_knows_delta_decimal_rule() -> None:
    # decimal(p, s) widens to decimal(p + k1, s + k2) where k1 >= k2 >= 0: no integer digit lost.
    dec = _schema("a DECIMAL(10,2), b DECIMAL(11,3), c DECIMAL(11,4), d DECIMAL(10,3)")
    a, b, c, d = (f.dataType for f in dec.fields)
    assert widens(a, b)
    assert not widens(a, c) and not widens(a, d)  # a digit of the integer part lost
    assert not widens(b, a) and not widens(a, a)


def test_strict_stops_at_any_difference() -> None:
    for table, batch in (("id INT", "id INT, extra STRING"), ("id INT, old STRING", "id INT"),
                         ("id INT", "id BIGINT")):
        with pytest.raises(SchemaConflictError, match="strict"):
            _compare(table, batch, "strict")
    assert not _compare("id INT", "id INT", "strict").alters_table


def test_a_partition_column_cannot_go() -> None:
    with pytest.raises(SchemaConflictError, match="partition column"):
        _compare("id INT, day STRING", "id INT", partition_by=("day",))
