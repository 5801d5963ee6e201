"""pgoutput decoding on hand-built messages (format: PostgreSQL manual, logical replication message formats)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest

from outbox.pgoutput import Begin, Commit, DecodeError, Insert, Other, Relation, decode, format_lsn, parse_lsn

_MICROS_2026 = int((datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) - datetime(2000, 1, 1, tzinfo=UTC)).total_seconds()
                   * 1_000_000)


def test_begin_and_commit() -> None:
    begin = decode(b"B" + struct.pack("!QqI", 0x1_0000_00A0, _MICROS_2026, 4242))
    assert begin == Begin(final_lsn=0x1_0000_00A0, commit_time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), xid=4242)
    commit = decode(b"C" + struct.pack("!BQQq", 0, 0x1_0000_00A0, 0x1_0000_00D8, _MICROS_2026))
    assert isinstance(commit, Commit) and (commit.commit_lsn, commit.end_lsn) == (0x1_0000_00A0, 0x1_0000_00D8)


def test_relation_and_insert_with_null_and_utf8() -> None:
    columns = [b"id", b"aggregatetype", b"payload"]
    body = struct.pack("!I", 16384) + b"public\0outbox\0" + b"d" + struct.pack("!H", len(columns))
    for name in columns:
        body += b"\x01" + name + b"\0" + struct.pack("!Ii", 25, -1)
    assert decode(b"R" + body) == Relation(16384, "public", "outbox", ("id", "aggregatetype", "payload"),
                                               (25, 25, 25))
    text = '{"name": "Zoë"}'.encode()
    tuple_data = (struct.pack("!H", 3) + b"t" + struct.pack("!I", 3) + b"abc" + b"n"
                  + b"t" + struct.pack("!I", len(text)) + text)
    assert decode(b"I" + struct.pack("!I", 16384) + b"N" + tuple_data) == Insert(16384, (b"abc", None, '{"name": "Zoë"}'.encode()))


def test_other_kinds_are_named_and_garbage_is_an_error() -> None:
    assert decode(b"O" + struct.pack("!Q", 1) + b"origin\0") == Other("O")
    with pytest.raises(DecodeError, match="truncated"):
        decode(b"B\x00\x01")
    with pytest.raises(DecodeError, match="empty"):
        decode(b"")
    with pytest.raises(DecodeError, match="unknown kind"):
        decode(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!H", 1) + b"x")


@pytest.mark.parametrize("text", ["0/0", "0/16B3748", "1A/FFFFFFFF"])
def test_lsn_text_round_trip(text: str) -> None:
    assert format_lsn(parse_lsn(text)) == text


def test_bad_lsn_text() -> None:
    with pytest.raises(DecodeError, match="not an LSN"):
        parse_lsn("16B3748")


def test_a_bytea_payload_arrives_as_its_bytes_and_escape_format_is_refused() -> None:
    from outbox.capture import _bytea
    from tidemark.errors import TerminalError

    assert _bytea(b"\\x00000000017b7d") == b"\x00\x00\x00\x00\x01{}"
    assert _bytea(b"\\x") == b""
    with pytest.raises(TerminalError, match="bytea_output = 'hex'"):
        _bytea(b"\\000\\001")
