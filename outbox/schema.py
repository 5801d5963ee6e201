"""The outbox table, what capture needs on the server, and the helper applications call.

The table follows Debezium's outbox defaults (``id uuid``, ``aggregatetype``,
``aggregateid``, ``type``, ``payload jsonb``) plus ``created_at`` for the relay's lag.
Capture needs a publication of the table's inserts (only inserts: the relay's own
deletes of relayed rows must not come back as events) and a ``pgoutput`` logical
replication slot, which keeps WAL from the moment it is created. Everything here is
idempotent, so ``tidemark outbox init`` can run on every deploy.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from tidemark.errors import ConfigError, TerminalError

OUTBOX_COLUMNS = ("id", "aggregatetype", "aggregateid", "type", "payload")

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class TableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        schema, _, name = text.rpartition(".")
        schema = schema or "public"
        for part in (schema, name):
            if not _IDENT.match(part):
                raise ConfigError(f"outbox table {text!r}: use lower-case [schema.]name, letters, digits and '_'")
        return cls(schema, name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql(self) -> str:
        return f'"{self.schema}"."{self.name}"'


PayloadType = Literal["jsonb", "bytea"]


def _ddl(table: TableName, payload: PayloadType = "jsonb") -> list[str]:
    return [
        f'CREATE SCHEMA IF NOT EXISTS "{table.schema}"',
        f"""CREATE TABLE IF NOT EXISTS {table.sql} (
            id            uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype varchar(255) NOT NULL,
            aggregateid   varchar(255) NOT NULL,
            type          varchar(255) NOT NULL,
            payload       {payload},
            created_at    timestamptz  NOT NULL DEFAULT clock_timestamp()
        )""",
        f'CREATE INDEX IF NOT EXISTS "{table.name}_created_at" ON {table.sql} (created_at)',
    ]


class SlotMissingError(TerminalError):
    """The outbox table exists but its replication slot does not: creating one now would lose rows."""


def init_outbox(dsn: str, *, table: TableName, publication: str, slot: str, create_slot: bool = True,
                payload: PayloadType = "jsonb") -> list[str]:
    """Create the table, the publication and the slot where missing; returns what was created.

    ``payload`` is the type of a new table's payload column: ``bytea`` holds values the
    application serialized itself, relayed unchanged (an existing table keeps its type; the
    relay follows the table's).

    A missing slot is created only together with a new table. Beside an existing table it
    would start at the current LSN, and rows committed while no slot existed would never
    be relayed: :class:`SlotMissingError` points at ``--reset-relay`` (``outbox.reset``),
    which creates the slot and requeues those rows. ``create_slot=False`` leaves the slot
    to that reset.
    """
    import psycopg2

    for name in (publication, slot):
        if not _IDENT.match(name):
            raise ConfigError(f"{name!r}: publication and slot names use lower-case letters, digits and '_'")
    created: list[str] = []
    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            (level,) = cur.fetchone()
            if level != "logical":
                raise ConfigError(f"PostgreSQL has wal_level={level}; the relay needs logical decoding: "
                                  "ALTER SYSTEM SET wal_level = logical, then restart the server")
            cur.execute("SELECT to_regclass(%s)", (table.sql,))
            new_table = cur.fetchone()[0] is None
            if new_table:
                created.append(f"table {table}")
            if payload not in ("jsonb", "bytea"):
                raise ConfigError(f"outbox payload type {payload!r}: use jsonb or bytea")
            for statement in _ddl(table, payload):
                cur.execute(statement)
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE PUBLICATION "{publication}" FOR TABLE {table.sql} WITH (publish = \'insert\')')
                created.append(f"publication {publication}")
            cur.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
            if row is None and not create_slot:
                pass
            elif row is None and not new_table:
                raise SlotMissingError(
                    f"replication slot {slot!r} does not exist but the outbox table {table} does: a slot made now "
                    "would start at the current LSN, and rows committed while none existed would never be relayed. "
                    "Run `tidemark outbox init --reset-relay`: it creates the slot, requeues the rows that remain "
                    "and moves the relay's position to the new slot (docs/runbooks.md, 'Relay recovery')")
            elif row is None:
                cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
                created.append(f"replication slot {slot}")
            elif row[0] != "pgoutput":
                raise ConfigError(f"replication slot {slot!r} exists with plugin {row[0]}, not pgoutput: "
                                  "choose another relay.slot or drop that slot")
    finally:
        conn.close()
    return created


def add_event(cursor: Any, aggregatetype: str, aggregateid: str, type: str, payload: Any, *,
              table: str = "public.outbox", event_id: uuid.UUID | None = None) -> uuid.UUID:
    """Add one event inside the caller's open transaction (any DB-API cursor with ``%s`` params).

    The event is relayed if and only if that transaction commits, together with the other
    events it added, as one Kafka transaction. ``payload`` is JSON-encoded unless it is
    already a string; ``bytes`` go into a ``bytea`` payload column as they are (the value the
    application serialized itself, which the relay sends unchanged).
    """
    event_id = event_id or uuid.uuid4()
    value: bytes | str
    if isinstance(payload, bytes | bytearray | memoryview):
        value, cast = bytes(payload), ""
    else:
        value = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        cast = "::jsonb"
    cursor.execute(
        f"INSERT INTO {TableName.parse(table).sql} (id, aggregatetype, aggregateid, type, payload) "
        f"VALUES (%s, %s, %s, %s, %s{cast})",
        (str(event_id), aggregatetype, aggregateid, type, value))
    return event_id
