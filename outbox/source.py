"""Is the database the relay reads the change stream its position counts in?

A position is an LSN, and an LSN means something only in one database cluster, on one
line of timelines, through one replication slot. The relay deletes outbox rows and
skips transactions by comparing LSNs with its position, so a position from another
stream would make it skip rows that were never relayed and delete them. Each case, and
why comparing LSNs would go wrong:

* **another cluster** (re-initialised, replaced): a new system identifier; its LSNs
  start over, below the position;
* **a restore or failover to a point before the position**: a newer timeline that
  forked from the position's timeline before the position, so transactions after the
  fork were relayed but are not in this database, and new ones reuse their LSNs. A fork
  after the position (a failover with nothing lost) is fine and is followed;
* **a slot dropped and created again**, or moved by someone else: outbox rows that the
  slot will never deliver are left in the table. A slot confirmed past the position is
  not proof by itself: psycopg2 moves an idle slot's confirmed position to the server's
  WAL end on keepalives once the relay has confirmed everything it received (so that WAL
  can be recycled while the outbox is quiet), and the next position is written only with
  the next group. The proof is a row the slot has passed: a visible outbox row inserted by
  a transaction older than the slot's ``catalog_xmin`` committed before the slot's
  restart point, and a healthy slot confirms past a row's commit only after the relay
  relayed and deleted it;
* **an invalidated slot** (WAL removed, ``max_slot_wal_keep_size``): it can never stream again.

Each is a :class:`SourceChangedError` with what was found and the recovery to run
(``tidemark outbox init --reset-relay``, docs/runbooks.md, "Relay recovery"); the
relay stops before producing, deleting or confirming anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from outbox.pgoutput import format_lsn, parse_lsn
from outbox.position import Position, Source
from tidemark.errors import TerminalError

RECOVERY = "docs/runbooks.md, 'Relay recovery'"


class SourceChangedError(TerminalError):
    """The database, its timeline or the slot is not the stream the relay's position counts in."""


@dataclass(frozen=True)
class Slot:
    name: str
    exists: bool
    confirmed_flush_lsn: int | None = None
    invalid: str | None = None
    """Why the server invalidated it (``wal_status = lost``, ``invalidation_reason``), or None."""
    active_pid: int | None = None
    stranded: int = 0
    """Visible outbox rows inserted before the slot's ``catalog_xmin``: rows it has passed without delivering."""
    stranded_example: str | None = None


def identify(replication_cursor: object, slot: str) -> Source:
    """This server's stream: ``IDENTIFY_SYSTEM`` on a replication connection."""
    replication_cursor.execute("IDENTIFY_SYSTEM")  # type: ignore[attr-defined]
    system_id, timeline, _, _ = replication_cursor.fetchone()  # type: ignore[attr-defined]
    return Source(str(system_id), int(timeline), slot)


def fork_point(replication_cursor: object, current: int, earlier: int) -> int | None:
    """The LSN where timeline ``earlier`` ended on the way to ``current`` (None: not an ancestor)."""
    replication_cursor.execute(f"TIMELINE_HISTORY {int(current)}")  # type: ignore[attr-defined]
    _, content = replication_cursor.fetchone()  # type: ignore[attr-defined]
    text = bytes(content).decode() if isinstance(content, bytes | memoryview) else str(content)
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0].strip().isdigit() and int(parts[0]) == earlier:
            return parse_lsn(parts[1].strip())
    return None


def slot_state(cursor: object, slot: str, table_sql: str | None = None, position: int | None = None) -> Slot:
    """The slot as ``pg_replication_slots`` shows it (any server version: read as JSON), and, given
    the outbox table and a slot confirmed past ``position``, the rows it has passed without
    delivering (see the module docstring). A slot not past the position has passed none (a
    healthy slot passes a row only after its deletion), so the table is not scanned then."""
    cursor.execute("SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = %s", (slot,))  # type: ignore[attr-defined]
    row = cursor.fetchone()  # type: ignore[attr-defined]
    if row is None:
        return Slot(slot, exists=False)
    data = row[0] if isinstance(row[0], dict) else json.loads(row[0])
    invalid = data.get("invalidation_reason") or ("wal_status = lost" if data.get("wal_status") == "lost" else None)
    confirmed = data.get("confirmed_flush_lsn")
    stranded, example = 0, None
    past = confirmed is not None and position is not None and parse_lsn(confirmed) > position
    if table_sql is not None and past and data.get("catalog_xmin") is not None:
        # age() compares 32-bit xids across wraparound; freezing keeps a row's raw xmin.
        cursor.execute(f"SELECT count(*), min(o.id::text) FROM {table_sql} o "  # type: ignore[attr-defined]
                       "WHERE age(o.xmin) > age(%s::text::xid)", (str(data["catalog_xmin"]),))
        stranded, example = cursor.fetchone()  # type: ignore[attr-defined]
    return Slot(slot, True, parse_lsn(confirmed) if confirmed else None, invalid, data.get("active_pid"),
                int(stranded), example)


def verify(position: Position | None, source: Source, slot: Slot, fork: int | None = None) -> None:
    """Raise :class:`SourceChangedError` unless ``position`` counts in ``source`` through ``slot``.

    ``fork``: where the position's timeline ended on the way to the current one, when they differ.
    The stream is compared before the slot: a database re-initialised or restored has lost its slot
    too, and the operator needs the cause, not its symptom.
    """
    if position is not None:
        _verify_stream(position, source, fork)
    if not slot.exists:
        raise SourceChangedError(
            f"replication slot {slot.name!r} does not exist: it was dropped, or this is another database. "
            f"Transactions committed while it was gone are not in any stream; nothing was relayed or deleted. "
            f"Recover with `tidemark outbox init --reset-relay` ({RECOVERY})")
    if slot.invalid:
        raise SourceChangedError(
            f"replication slot {slot.name!r} was invalidated by the server ({slot.invalid}): the WAL it needed is "
            f"gone, so it can never stream again. Nothing was deleted; recover with `tidemark outbox init "
            f"--reset-relay` ({RECOVERY}), and raise max_slot_wal_keep_size or keep the relay running")
    if position is not None and slot.stranded:
        confirmed = format_lsn(slot.confirmed_flush_lsn) if slot.confirmed_flush_lsn is not None else "?"
        raise SourceChangedError(
            f"replication slot {slot.name!r} (confirmed {confirmed}, the relay's position "
            f"{format_lsn(position.end_lsn)}) has passed {slot.stranded} outbox row(s) it never delivered, e.g. id "
            f"{slot.stranded_example}: it was created again or moved by someone else, so those rows are in no "
            f"stream. Nothing was relayed or deleted; recover with `tidemark outbox init --reset-relay` ({RECOVERY})")


def _verify_stream(position: Position, source: Source, fork: int | None) -> None:
    """The position's database system and timeline lead to ``source``'s."""
    recorded = position.source
    if recorded is not None and recorded.system_id != source.system_id:
        raise SourceChangedError(
            f"the relay's position {format_lsn(position.end_lsn)} was recorded on database system "
            f"{recorded.system_id}, but this server is system {source.system_id} (re-initialised or replaced). "
            f"Its LSNs mean nothing here; nothing was relayed or deleted. Recover with `tidemark outbox init "
            f"--reset-relay` ({RECOVERY})")
    forked = recorded is not None and recorded.timeline != source.timeline and (
        recorded.timeline > source.timeline or fork is None or position.end_lsn > fork)
    if forked:
        assert recorded is not None
        where = "not an ancestor of" if fork is None else f"left at {format_lsn(fork)} for"
        raise SourceChangedError(
            f"the relay's position {format_lsn(position.end_lsn)} is on timeline {recorded.timeline}, which is "
            f"{where} this server's timeline {source.timeline}: a restore or failover to a point before the "
            f"position. Transactions relayed after that point are not in this database. Nothing was relayed "
            f"or deleted; recover with `tidemark outbox init --reset-relay` ({RECOVERY})")
