"""The quality suite's column types: the table's against the pipeline's schema (real Spark)."""

from __future__ import annotations

from quality.facts import column_types


def test_column_types_name_each_column_whose_type_the_table_does_not_hold(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    table = StructType.fromDDL("id BIGINT, amount DOUBLE, line STRUCT<sku: STRING, qty: INT>, extra STRING")

    def problems(schema: str, strict: bool) -> dict[str, str | None]:
        declared = StructType.fromDDL(schema)
        return {r.column: r.problem for r in column_types(spark, table, declared, strict).collect()}

    # Additive: a table that holds a column wider, or a struct with more fields, holds the schema.
    assert problems("id INT, amount DOUBLE, line STRUCT<sku: STRING>", False) == {
        "id": None, "amount": None, "line": None}
    assert problems("id INT, amount DOUBLE", True) == {"id": "id: bigint in the table, int in the schema",
                                                       "amount": None}
    found = problems("id BIGINT, amount STRING, line STRUCT<sku: STRING, qty: BIGINT>, gone INT", False)
    assert found["id"] is None
    assert found["amount"] == "amount: double in the table does not hold the schema's string"
    assert found["line"] is not None and found["line"].startswith("line: struct<sku:string,qty:int> in the table")
    assert found["gone"] == "gone: not in the table (the schema has int)"
