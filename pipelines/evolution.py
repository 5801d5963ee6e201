"""Schema evolution: how a batch whose columns differ from its target's may still be written.

A pipeline's batch schema comes from its settings (for JSON, ``schema`` in
``tidemark.yaml`` and the lineage columns); the target's is whatever its last commit left.
When they differ, :func:`compare` decides, before anything is claimed or written:

* **additive** (the default):

  - a column the table lacks is added, nullable;
  - a column the table has and the batch lacks stays, null in the batch's rows;
  - a type the table must widen (a widening Delta applies by itself: byte→short→int→long,
    float→double, date→timestamp_ntz, a decimal of more precision and no less room for its
    integer digits) stops the pipeline, unless it opted in with ``type_widening: allow``;
    then the column is widened;
  - a type the table already holds wider (records written with an older, narrower schema)
    is written as it stands, cast up by Delta;
  - anything else (long→string, a struct turned into a string, an integer into a double,
    which Delta only does by hand) stops the pipeline.

* **strict**: any difference stops the pipeline.

Why a widening needs the opt-in: Delta widens a column by turning on its ``typeWidening``
reader feature, and a reader that lacks the feature refuses every version of the table,
not only the new ones. delta-spark reads it from 4.0 on; delta-rs (the ``deltalake``
package, 1.6.6 in this project) and what is built on it (Polars, DuckDB's delta reader
through delta-rs) do not read it at all. Whether every reader of a table can follow is
the table owner's call, not an upstream schema's. Until then the pipeline stops before
its claim, so the records of the wider schema wait in Kafka: nothing is quarantined.

Why the change rides with the batch: the commit protocol's step 4 writes the rows, the
offsets and (with ``mergeSchema``) the new schema in one Delta commit, so a crash can never
leave a table whose schema changed without the batch that changed it, or the reverse. The
one separate commit is turning on Delta's type widening feature for the first widening
(``delta.enableTypeWidening``): it changes no schema and no data, so a crash after it only
leaves the feature on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

SchemaEvolution = Literal["additive", "strict"]
TypeWidening = Literal["refuse", "allow"]

#: Who cannot read a table once a widening turns on Delta's ``typeWidening`` reader feature.
WIDENING_READERS = ("readers need delta-spark 4.0 or later; delta-rs (the deltalake package) and the tools "
                    "built on it (Polars, DuckDB's delta reader) refuse every version of the table")

#: Integer types in order of width: each widens automatically to any after it.
_INTEGERS = ("byte", "short", "integer", "long")


class SchemaConflictError(ConfigError):
    """The batch's schema cannot be written to the target as it stands: nothing was written."""


@dataclass(frozen=True)
class SchemaChange:
    """What writing the batch does to the target's schema (empty: nothing)."""

    added: tuple[str, ...] = ()
    """New columns (dotted paths for fields inside structs), as ``name type``."""
    widened: tuple[tuple[str, str, str], ...] = ()
    """``(column, table's type, new type)`` for each type the table widens."""
    kept: tuple[str, ...] = ()
    """The table's columns the batch lacks: they stay, null in its rows."""

    @property
    def alters_table(self) -> bool:
        """Whether the write changes the table's schema (needs ``mergeSchema``)."""
        return bool(self.added or self.widened)

    def describe(self) -> str:
        parts = [f"adds {', '.join(self.added)}"] if self.added else []
        parts += [f"widens {c} {a} → {b}" for c, a, b in self.widened]
        if self.kept:
            parts.append(f"keeps {', '.join(self.kept)} (no longer in the batch: null from now on)")
        return "; ".join(parts) or "no change"


def widens(narrow: DataType, wide: DataType) -> bool:
    """Whether Delta widens ``narrow`` to ``wide`` by itself, in a write with schema evolution."""
    a, b = narrow.typeName(), wide.typeName()
    if a in _INTEGERS and b in _INTEGERS:
        return _INTEGERS.index(a) < _INTEGERS.index(b)
    if (a, b) in {("float", "double"), ("date", "timestamp_ntz")}:
        return True
    if a == b == "decimal":
        p1, s1 = narrow.precision, narrow.scale  # type: ignore[attr-defined]
        p2, s2 = wide.precision, wide.scale  # type: ignore[attr-defined]
        return (p1, s1) != (p2, s2) and s2 >= s1 and p2 - s2 >= p1 - s1
    return False


def compare(table: StructType, batch: StructType, mode: SchemaEvolution, *, pipeline: str, target: str,
            partition_by: tuple[str, ...] = (), type_widening: TypeWidening = "refuse") -> SchemaChange:
    """How writing ``batch`` changes ``table``, or :class:`SchemaConflictError` naming the field,
    both types and what to do. A widening is refused unless ``type_widening`` allows it: it cuts
    off every reader without Delta's type widening support (module doc)."""
    added: list[str] = []
    widened: list[tuple[str, str, str]] = []
    kept: list[str] = []
    conflicts: list[str] = []
    _compare_struct(table, batch, "", added, widened, kept, conflicts)
    missing_keys = [c for c in partition_by if c.lower() in {k.lower() for k in kept}]
    where = f"pipeline {pipeline!r}: the batch's schema does not fit the target {target}"
    if conflicts:
        raise SchemaConflictError(
            f"{where}: {'; '.join(conflicts)}. Nothing was written. Put the field's type back in `schema`, "
            "or give the new type another field name, or send the pipeline to a new target (docs/schemas.md, "
            "Schema changes)")
    if missing_keys:
        raise SchemaConflictError(
            f"{where}: partition column(s) {', '.join(missing_keys)} are no longer in the batch. Nothing was "
            "written. Put them back in `schema` (docs/schemas.md, Schema changes)")
    change = SchemaChange(tuple(added), tuple(widened), tuple(kept))
    if mode == "strict" and (change.alters_table or change.kept):
        raise SchemaConflictError(
            f"{where}: the batch {change.describe()}, and `schema_evolution` is strict. Nothing was written. "
            "Undo the change in `schema`, or set `schema_evolution: additive` (docs/schemas.md, Schema changes)")
    if change.widened and type_widening != "allow":
        widenings = "; ".join(f"field {c} is {a} in the table and {b} in the batch" for c, a, b in change.widened)
        raise SchemaConflictError(
            f"{where}: {widenings}, a type widening the pipeline has not opted into. Nothing was written; the "
            f"records wait in Kafka. Either set `type_widening: allow` on the pipeline, which turns on Delta's "
            f"typeWidening reader feature on the table (its {WIDENING_READERS}), or give the wider field a new name, "
            "a new column that every reader can read (docs/schemas.md, Schema changes)")
    return change


def _compare_struct(table: StructType, batch: StructType, prefix: str, added: list[str],
                    widened: list[tuple[str, str, str]], kept: list[str], conflicts: list[str]) -> None:
    # Delta resolves column names case-insensitively (Spark's default), and so does this.
    theirs = {f.name.lower(): f for f in table.fields}
    ours = {f.name.lower() for f in batch.fields}
    for field in batch.fields:
        name = prefix + field.name
        existing = theirs.get(field.name.lower())
        if existing is None:
            added.append(f"{name} {field.dataType.simpleString()}")
        else:
            _compare_type(existing.dataType, field.dataType, name, added, widened, kept, conflicts)
    kept.extend(prefix + f.name for f in table.fields if f.name.lower() not in ours)


def _compare_type(old: DataType, new: DataType, name: str, added: list[str],
                  widened: list[tuple[str, str, str]], kept: list[str], conflicts: list[str]) -> None:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(old, StructType) and isinstance(new, StructType):
        _compare_struct(old, new, f"{name}.", added, widened, kept, conflicts)
    elif isinstance(old, ArrayType) and isinstance(new, ArrayType):
        _compare_type(old.elementType, new.elementType, f"{name}.element", added, widened, kept, conflicts)
    elif isinstance(old, MapType) and isinstance(new, MapType):
        _compare_type(old.keyType, new.keyType, f"{name}.key", added, widened, kept, conflicts)
        _compare_type(old.valueType, new.valueType, f"{name}.value", added, widened, kept, conflicts)
    elif old == new or widens(new, old):
        pass  # the same, or the table already holds it wider (Delta casts the batch's values up)
    elif widens(old, new):
        widened.append((name, old.simpleString(), new.simpleString()))
    else:
        conflicts.append(f"field {name} is {old.simpleString()} in the table and {new.simpleString()} in the "
                         "batch, a change Delta cannot make by itself")
