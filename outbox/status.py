"""A relay seen from outside: its position, its slot's state and its lag, for ``tidemark relay status`` and metrics.

Why this is its own module: an operator asks how far a relay is while it runs (or while it
is down) from another process, so this reads what the relay leaves behind (its position in
the offsets topic, its replication slot, the outbox rows not yet acknowledged) and never
takes part in the protocol (``outbox.relay``).
"""

from __future__ import annotations

from typing import Any

from outbox.pgoutput import format_lsn
from outbox.position import PositionUnreadableError, read_position
from outbox.schema import TableName
from tidemark.config import RelayConfig
from tidemark.errors import ConfigError, ServiceUnavailableError


def relay_status(relay: RelayConfig, *, dsn: str, client_config: dict[str, Any]) -> dict[str, str]:
    """Position, slot state and lag (events not yet relayed, age of the oldest); Kafka being down is a state."""
    import psycopg2

    table = TableName.parse(relay.table)
    try:
        position = read_position(client_config, relay.offsets_topic, relay.id, wait=5)
        status = {"relay": relay.id, "position": format_lsn(position.end_lsn) if position else "(none yet)",
                  "last relayed at": position.relayed_at if position else "-"}
    except (ServiceUnavailableError, PositionUnreadableError) as exc:
        status = {"relay": relay.id, "position": f"(Kafka unavailable: {exc})", "last relayed at": "?"}
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_jsonb(s), pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)) "
                        "FROM pg_replication_slots s WHERE slot_name = %s", (relay.slot_name,))
            row = cur.fetchone()
            if row is None:
                raise ConfigError(f"replication slot {relay.slot_name!r} does not exist: run `tidemark outbox init`")
            slot, retained = row[0], row[1]
            active = f"active, pid {slot['active_pid']}" if slot.get("active") else "inactive"
            invalid = slot.get("invalidation_reason") or ("WAL lost" if slot.get("wal_status") == "lost" else None)
            status["slot"] = f"{relay.slot_name} ({active}{', INVALIDATED: ' + invalid if invalid else ''})"
            status["slot confirmed"] = str(slot.get("confirmed_flush_lsn"))
            status["WAL retained"] = str(retained)
            pending, age = _backlog(cur, table)
            status["lag (events)"] = str(pending)
            status["lag (seconds)"] = f"{age:.1f}"
    finally:
        conn.close()
    return status


def _backlog(cur: Any, table: TableName) -> tuple[int, float]:
    cur.execute(f"SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at)) FROM {table.sql}")
    pending, age = cur.fetchone()
    return int(pending), max(0.0, float(age)) if age is not None else 0.0


def relay_backlog(relay: RelayConfig, dsn: str) -> tuple[int, float]:
    """(outbox rows not yet relayed and acknowledged, age in seconds of the oldest; 0 when none)."""
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            return _backlog(cur, TableName.parse(relay.table))
    finally:
        conn.close()
