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
from tidemark.config import RelayConfig, SchemaRegistryConfig
from tidemark.errors import ConfigError, ServiceUnavailableError
from tidemark.settings import Settings

#: How long ``relay status`` waits for the schema registry to answer.
REGISTRY_STATUS_SECONDS = 5


def relay_status(relay: RelayConfig, *, dsn: str, client_config: dict[str, Any],
                 registry: SchemaRegistryConfig | None = None, settings: Settings | None = None) -> dict[str, str]:
    """Position, slot state and lag (events not yet relayed, age of the oldest); Kafka being down is a state,
    and so is, given ``registry`` for a relay of ``format`` avro or protobuf, a registry that does not answer."""
    import psycopg2

    table = TableName.parse(relay.table)
    try:
        position = read_position(client_config, relay.offsets_topic, relay.id, wait=5)
        status = {"relay": relay.id, "position": format_lsn(position.end_lsn) if position else "(none yet)",
                  "last relayed at": position.relayed_at if position else "-"}
    except (ServiceUnavailableError, PositionUnreadableError) as exc:
        status = {"relay": relay.id, "position": f"(Kafka unavailable: {exc})", "last relayed at": "?"}
    if registry is not None and relay.format != "json":
        status["schema registry"] = registry_state(registry, settings)
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


def registry_state(registry: SchemaRegistryConfig, settings: Settings | None = None) -> str:
    """Whether the schema registry a relay serializes with answers now: a relay whose lookup it does
    not answer waits for it (``outbox.outage``), and this is how its operator sees why."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from connectors.registry import client_config, registry_url
    from tidemark.settings import load_settings

    url = registry_url(registry, settings or load_settings())
    try:
        SchemaRegistryClient({**client_config(registry, url), "timeout": REGISTRY_STATUS_SECONDS}).get_subjects()
    except SchemaRegistryError as exc:
        return f"{url} refuses (HTTP {exc.http_status_code}: {exc.error_message})"
    except Exception as exc:  # noqa: BLE001 - httpx's and the OS's connection failures
        return (f"{url} does not answer ({type(exc).__name__}: {exc}); a relay that needs it waits, and resumes "
                "once it answers")
    return f"{url} answers"
