"""Decode PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

Only what the relay needs: Begin, Relation, Insert and Commit. The server sends a
transaction's changes after it commits, between its Begin and Commit, in commit order;
that is what makes capture ordered by commit rather than by transaction id. Other
message kinds (Origin, Type, Update, Delete, Truncate, logical messages) are returned as
:class:`Other` so the caller can ignore them on purpose. Pure functions, no I/O: the
format is specified in the PostgreSQL manual, "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tidemark.errors import TerminalError

#: pgoutput timestamps count microseconds from 2000-01-01 UTC.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class DecodeError(TerminalError):
    """A replication message does not follow the pgoutput format we expect."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    """LSN of the transaction's commit record."""
    commit_time: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    """LSN just past the commit record: the position to confirm to the slot."""
    commit_time: datetime


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    columns: tuple[str, ...]
    types: tuple[int, ...] = ()
    """Each column's type oid, in the same order (``bytea`` is 17, ``jsonb`` 3802)."""


@dataclass(frozen=True)
class Insert:
    relation_oid: int
    values: tuple[bytes | None, ...]
    """Each column's text form as sent, UTF-8 bytes (None for SQL NULL), in the relation's column order.
    Kept as bytes: the relay sends them on as they are, so decoding them would only cost."""


@dataclass(frozen=True)
class Other:
    kind: str


Message = Begin | Commit | Relation | Insert | Other


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise DecodeError(f"pgoutput message truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def byte(self) -> str:
        return chr(self.take("!B"))

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError(f"pgoutput string not terminated at byte {self.pos}")
        text = self.data[self.pos:end].decode()
        self.pos = end + 1
        return text

    def timestamp(self) -> datetime:
        return _PG_EPOCH + timedelta(microseconds=self.take("!q"))


def _tuple(data: bytes, pos: int) -> tuple[bytes | None, ...]:
    """The tuple at ``data[pos:]``: the hot path of capture, so plain slicing, no reader object."""
    values: list[bytes | None] = []
    try:
        (count,) = _H.unpack_from(data, pos)
        pos += 2
        for _ in range(count):
            kind = data[pos]
            pos += 1
            if kind == 0x74:  # 't': text
                (size,) = _I.unpack_from(data, pos)
                pos += 4
                if pos + size > len(data):
                    raise DecodeError(f"pgoutput value truncated at byte {pos}")
                values.append(data[pos:pos + size])
                pos += size
            elif kind == 0x6E:  # 'n': null
                values.append(None)
            elif kind == 0x75:  # 'u'
                # An unchanged TOASTed value: only in updates, which the publication does not send.
                raise DecodeError("pgoutput sent an unchanged TOAST value in an insert")
            else:
                raise DecodeError(f"pgoutput tuple column of unknown kind {chr(kind)!r}")
    except (struct.error, IndexError):
        raise DecodeError(f"pgoutput tuple truncated at byte {pos}") from None
    return tuple(values)


_H = struct.Struct("!H")
_I = struct.Struct("!I")


def decode(payload: bytes) -> Message:
    """One pgoutput message."""
    if not payload:
        raise DecodeError("empty pgoutput message")
    r = _Reader(payload)
    kind = r.byte()
    if kind == "B":
        return Begin(final_lsn=r.take("!Q"), commit_time=r.timestamp(), xid=r.take("!I"))
    if kind == "C":
        r.take("!B")  # flags, unused
        return Commit(commit_lsn=r.take("!Q"), end_lsn=r.take("!Q"), commit_time=r.timestamp())
    if kind == "R":
        oid = r.take("!I")
        namespace, name = r.string(), r.string()
        r.take("!B")  # replica identity
        columns, types = [], []
        for _ in range(r.take("!H")):
            r.take("!B")  # flags (part of the key)
            columns.append(r.string())
            types.append(r.take("!I"))
            r.take("!i")  # type modifier
        return Relation(oid, namespace, name, tuple(columns), tuple(types))
    if kind == "I":
        oid = r.take("!I")
        if r.byte() != "N":
            raise DecodeError("pgoutput insert without a new tuple")
        return Insert(oid, _tuple(payload, r.pos))
    return Other(kind)


def format_lsn(lsn: int) -> str:
    """PostgreSQL's text form of an LSN, e.g. ``0/16B3748``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    try:
        high, low = text.split("/")
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        raise DecodeError(f"not an LSN: {text!r} (expected e.g. 0/16B3748)") from None
