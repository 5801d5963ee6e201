"""Dead letters: outbox events Kafka cannot take, moved aside whole with their source transaction.

An event larger than the producer's or the topic's message size limit can never be
produced; a relay that tried would fail on it at every start (the slot sends it again).
So the relay checks sizes first, and a source transaction with such an event is either
refused, stopping the relay with the event named (``relay.on_oversized: stop``), or moved
here whole (``dead_letter``). ``tidemark relay dead-letter --xid N`` is the operator's
explicit acknowledgement under ``stop``: it copies the transaction's rows here, and the
relay then skips that transaction (its position moves past it, its outbox rows are
deleted). Nothing is half-relayed and nothing disappears: every skipped event is in this
table, with the reason.
"""

from __future__ import annotations

from typing import Any

from outbox.schema import TableName
from tidemark.errors import TerminalError


class RefusedTransactionError(TerminalError):
    """A source transaction the relay may not produce (none of it is) and that was not acknowledged as
    a dead letter: the relay stops before it."""


class OversizedEventError(RefusedTransactionError):
    """An event is larger than Kafka takes and its source transaction was not acknowledged as a dead letter."""


class InvalidPayloadError(RefusedTransactionError):
    """An event's payload does not match its subject's schema (``relay.format: avro`` or ``protobuf``)."""


def ddl(table: TableName, payload: str = "jsonb") -> str:
    """The dead letters' table; its payload column has the outbox's type (``jsonb`` or ``bytea``)."""
    return f"""CREATE TABLE IF NOT EXISTS {table.sql} (
        id               uuid         PRIMARY KEY,
        aggregatetype    varchar(255) NOT NULL,
        aggregateid      varchar(255) NOT NULL,
        type             varchar(255) NOT NULL,
        payload          {payload},
        created_at       timestamptz  NOT NULL,
        xid              bigint       NOT NULL,
        reason           text         NOT NULL,
        dead_lettered_at timestamptz  NOT NULL DEFAULT clock_timestamp()
    )"""


def _copy(cursor: Any, outbox: TableName, dead: TableName, where: str, params: tuple[Any, ...], reason: str) -> int:
    cursor.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                   "WHERE attrelid = %s::regclass AND attname = 'payload' AND NOT attisdropped", (outbox.sql,))
    found = cursor.fetchone()
    cursor.execute(ddl(dead, "bytea" if found is not None and found[0] == "bytea" else "jsonb"))
    cursor.execute(
        f"INSERT INTO {dead.sql} (id, aggregatetype, aggregateid, type, payload, created_at, xid, reason) "
        f"SELECT id, aggregatetype, aggregateid, type, payload, created_at, xmin::text::bigint, %s "
        f"FROM {outbox.sql} WHERE {where} ON CONFLICT (id) DO NOTHING", (reason, *params))
    return int(cursor.rowcount)


def dead_letter_events(cursor: Any, outbox: TableName, dead: TableName, ids: list[str], reason: str) -> int:
    """Copy the outbox rows ``ids`` to the dead letters (idempotent); the relay deletes them after its commit."""
    return _copy(cursor, outbox, dead, "id = ANY(%s::uuid[])", (ids,), reason)


def dead_letter_transaction(cursor: Any, outbox: TableName, dead: TableName, xid: int, reason: str) -> int:
    """The acknowledgement: copy every outbox row source transaction ``xid`` inserted; returns how many."""
    return _copy(cursor, outbox, dead, "xmin = %s::text::xid", (str(xid),), reason)


def acknowledged(cursor: Any, dead: TableName, ids: list[str]) -> bool:
    """Are all of ``ids`` in the dead letters (so their transaction is to be skipped)?"""
    cursor.execute("SELECT to_regclass(%s)", (dead.sql,))
    if cursor.fetchone()[0] is None:
        return False
    cursor.execute(f"SELECT count(*) FROM {dead.sql} WHERE id = ANY(%s::uuid[])", (ids,))
    return int(cursor.fetchone()[0]) == len(set(ids))
