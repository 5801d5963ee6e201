"""Avro bodies of one record schema written by a function made for that schema.

The relay serializes every payload of a topic with the same schema, and fastavro's generic
writer walks that schema anew for each one: half of the relay's extra cost per event in
``relay.format: avro``. :func:`compile_writer` turns a schema once into straight-line Python
(its fields in order, each type's encoding inlined), which writes the same bytes in about
half the time.

It covers what outbox payloads are made of: records (nested too), null, boolean, int, long,
float, double, string, enums, and unions of null with one of these. A schema with anything
else (arrays, maps, bytes, fixed, logical types, wider unions, named references) gets no
compiled writer, and fastavro writes it. A compiled writer is strict: a value of any other
Python type, an int out of its range, a missing field without a default, raises, and the
caller falls back to fastavro, whose validation then names the field. So what is written
never differs from fastavro's bytes; ``tests/unit/test_avro_writer.py`` holds the two to
that on random records.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

Writer = Callable[[Any], bytes]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "string"})
_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


class Unsupported(Exception):
    """The schema has a part no compiled writer covers: fastavro writes it."""


def _no(value: Any) -> Any:
    """A value the compiled writer does not take (the caller asks fastavro, which names the field)."""
    raise TypeError(f"{type(value).__name__} value not written by the compiled writer")


def _long(n: int) -> bytes:
    """Avro's zig-zag varint of ``n`` (already checked to be in range)."""
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]
_LENGTHS = [bytes([2 * i]) for i in range(0x40)]
"""A string's length prefix, for lengths below 64 (one byte)."""


def compile_writer(schema: Mapping[str, Any]) -> Writer | None:
    """A writer of ``schema``'s records (``schema`` as ``json.loads`` reads it), or None when a
    part of it is not covered (then fastavro writes it)."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return None
    constants: list[Any] = []
    lines = ["def write(r):", "    if type(r) is not dict:", "        _no(r)", "    o = []",
             "    a = o.append"]
    try:
        _record(schema, "r", lines, constants, depth=1)
    except Unsupported:
        return None
    lines.append("    return b''.join(o)")
    scope: dict[str, Any] = {"_no": _no, "_long": _long, "_L": _LENGTHS, "_d": struct.Struct("<d").pack,
                             "_f": struct.Struct("<f").pack, "_c": constants}
    exec(compile("\n".join(lines), f"<avro writer of {schema.get('name')}>", "exec"), scope)  # noqa: S102
    return scope["write"]  # type: ignore[no-any-return]


def _record(schema: Mapping[str, Any], var: str, lines: list[str], constants: list[Any], depth: int) -> None:
    for i, field in enumerate(schema.get("fields", ())):
        name = field["name"]
        if "default" in field:
            default = field["default"]
            if not isinstance(default, str | int | float | bool | type(None)):
                raise Unsupported("a default that is not a primitive")
            constants.append(default)
            get = f"{var}.get({name!r}, _c[{len(constants) - 1}])"
        else:
            get = f"{var}.get({name!r})"  # fastavro's None for a missing field: only a null type takes it
        v = f"v{depth}_{i}"
        lines.append(f"    {v} = {get}")
        _value(field["type"], v, lines, constants, depth)


def _value(schema: Any, v: str, lines: list[str], constants: list[Any], depth: int) -> None:
    """Lines that append ``v``'s encoding as ``schema`` to ``o``, or raise on a value that is not one."""
    if isinstance(schema, list):
        _union(schema, v, lines, constants, depth)
        return
    kind = schema.get("type") if isinstance(schema, Mapping) else schema
    if isinstance(schema, Mapping) and kind in _PRIMITIVES:
        if "logicalType" in schema:
            raise Unsupported("a logical type")
        schema = kind
    if kind == "record":
        lines += [f"    if type({v}) is not dict:", f"        _no({v})"]
        _record(schema, v, lines, constants, depth + 1)
    elif kind == "enum":
        constants.append({s: _long(i) for i, s in enumerate(schema["symbols"])})
        lines.append(f"    a(_c[{len(constants) - 1}][{v}]) if type({v}) is str else _no({v})")
    elif kind == "null":
        lines += [f"    if {v} is not None:", f"        _no({v})"]
    elif kind == "boolean":
        lines.append(f"    a(b'\\x01' if {v} is True else b'\\x00' if {v} is False else _no({v}))")
    elif kind in ("int", "long"):
        low, high = _RANGES[kind]
        lines.append(f"    a(_long({v}) if type({v}) is int and {low} <= {v} <= {high} else _no({v}))")
    elif kind in ("float", "double"):
        pack = "_f" if kind == "float" else "_d"
        lines.append(f"    a({pack}({v}) if type({v}) is float or type({v}) is int else _no({v}))")
    elif kind == "string":
        b = f"b{v}"
        lines += [f"    {b} = {v}.encode() if type({v}) is str else _no({v})",
                  f"    a(_L[len({b})] if len({b}) < 64 else _long(len({b})))", f"    a({b})"]
    else:
        raise Unsupported(f"type {kind!r}")


def _union(branches: list[Any], v: str, lines: list[str], constants: list[Any], depth: int) -> None:
    """``[null, T]`` or ``[T, null]``: the branch's index, then the value (fastavro's choice for both)."""
    if len(branches) != 2 or "null" not in branches or branches[0] == branches[1]:
        raise Unsupported("a union other than null and one type")
    null = branches.index("null")
    other = branches[1 - null]
    kind = other.get("type") if isinstance(other, Mapping) else other
    if kind not in _PRIMITIVES - {"null"} and kind != "enum":
        raise Unsupported(f"a union with {kind!r}")  # fastavro's choice of branch reads a record's fields
    lines += [f"    if {v} is None:", f"        a({_long(null)!r})", "    else:", f"        a({_long(1 - null)!r})"]
    inner: list[str] = []
    _value(other, v, inner, constants, depth)
    lines += ["    " + line for line in inner]
