"""Committed outbox transactions from a logical replication slot, in commit order.

Why logical decoding and not a polling cursor: the server decodes a transaction only
once it has committed and sends transactions in commit order, each whole, between its
Begin and Commit. A cursor on a sequence id or a transaction id (even the ``xid8``
snapshot-xmin cursor, which never skips a late commit) orders by id, so two
transactions on one aggregate that commit in the opposite order of their ids would be
relayed in the wrong order for that key. The slot also keeps the server's WAL until
we confirm a position, so nothing is lost while the relay is down.

:class:`Capture` only reads and confirms; the relay decides what a position means. Its
connection names itself ``tidemark-relay-<id>`` (``application_name``), so a relay
that finds the slot busy can tell a fenced predecessor of its own from anything else.
Events keep the bytes the server sent: the relay passes them on unchanged, and holds
each transaction once, in this form.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from dataclasses import dataclass
from datetime import datetime

from outbox import pgoutput
from outbox.position import Source
from outbox.schema import OUTBOX_COLUMNS, TableName
from outbox.source import Slot, fork_point, identify, slot_state
from tidemark.errors import TerminalError, TransientError

log = logging.getLogger(__name__)


class SlotBusyError(TransientError):
    """Another connection (perhaps a fenced relay) is still streaming from the slot."""

    def __init__(self, slot: str, pid: int | None, *, holder: str | None = None) -> None:
        self.pid = pid
        who = f" ({holder!r}, not a relay with this id, so it is left alone)" if holder is not None else \
            "; another relay with this id may still be running"
        super().__init__(f"replication slot {slot!r} is in use by server process {pid or '?'}{who}")


BYTEA_OID = 17


def _bytea(text: bytes) -> bytes:
    """A ``bytea`` value from its text form in the stream (``\\x`` and hex, PostgreSQL's default output)."""
    if not text.startswith(b"\\x"):
        raise TerminalError("the outbox's bytea payload arrived in escape format; set bytea_output = 'hex' "
                            "(PostgreSQL's default) for the database and restart the relay")
    return bytes.fromhex(text[2:].decode("ascii"))


class ReplicationLostError(TransientError):
    """The replication stream broke (the server restarted, was replaced, or ended the session)."""


class TransactionTooLargeError(TerminalError):
    """A source transaction has more events or bytes than the relay may put in one Kafka transaction."""


@dataclass(frozen=True)
class OutboxEvent:
    id: bytes
    aggregatetype: bytes
    aggregateid: bytes
    type: bytes
    payload: bytes | None
    """The ``jsonb`` payload in PostgreSQL's text form, or None for SQL NULL; of a ``bytea``
    payload column, its bytes."""
    serialized: bool = False
    """The payload column is ``bytea``: the application serialized the value itself, and the
    relay sends it unchanged, whatever ``relay.format`` (as Debezium's ``ByteBufferConverter``)."""

    @property
    def size(self) -> int:
        return len(self.id) + len(self.aggregatetype) + len(self.aggregateid) + len(self.type) + len(self.payload or b"")


@dataclass(frozen=True)
class SourceTransaction:
    xid: int
    commit_lsn: int
    end_lsn: int
    """The slot position that confirms this transaction."""
    commit_time: datetime
    events: tuple[OutboxEvent, ...]
    size: int = 0
    """Bytes of its events (ids, types, keys, payloads)."""
    values: tuple[bytes | None, ...] | None = None
    """``relay.format: avro``/``protobuf``: each event's payload as its topic's value, set at step 4
    (``outbox.admission``); None: the payloads go as they are. A tuple beside the events, not new
    events: a frozen dataclass's construction cost 1 µs an event, a sixth of what encoding costs."""


class Capture:
    """One replication connection streaming the outbox table's inserts from ``slot``."""

    def __init__(self, dsn: str, *, slot: str, publication: str, table: TableName,
                 max_events: int, max_bytes: int | None = None, application_name: str = "tidemark-relay") -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.table = table
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.application_name = application_name
        self.source: Source | None = None
        """The server's stream, identified when the connection opened."""
        self._conn = None
        self._cur = None
        self._relations: dict[int, pgoutput.Relation] = {}
        self._columns: dict[int, tuple[tuple[int, ...], bool] | None] = {}

    def connect(self) -> Source:
        """Connect and identify the server's stream (``IDENTIFY_SYSTEM``); streaming starts with :meth:`start`."""
        import psycopg2
        from psycopg2.extras import LogicalReplicationConnection

        self.close()
        try:
            self._conn = psycopg2.connect(self.dsn, connection_factory=LogicalReplicationConnection,
                                          application_name=self.application_name)
            self._cur = self._conn.cursor()  # type: ignore[attr-defined]
            self.source = identify(self._cur, self.slot)
        except psycopg2.Error:
            self.close()
            raise
        return self.source

    def slot_state(self, position: int | None) -> Slot:
        """The slot as the server sees it now (before :meth:`start`), judged against the relay's ``position``."""
        assert self._cur is not None
        return slot_state(self._cur, self.slot, self.table.sql, position)

    def fork_point(self, earlier: int) -> int | None:
        """Where timeline ``earlier`` ended on the way to this server's (before :meth:`start`)."""
        assert self._cur is not None and self.source is not None
        return fork_point(self._cur, self.source.timeline, earlier)

    def start(self) -> None:
        import psycopg2

        assert self._cur is not None
        try:
            self._cur.start_replication(slot_name=self.slot, decode=False, status_interval=5, options={
                "proto_version": "1", "publication_names": self.publication})
        except psycopg2.Error as exc:
            self.close()
            text = str(exc)
            if "is active for PID" in text:
                pid = text.rsplit("PID", 1)[1].strip().split()[0].rstrip(".")
                raise SlotBusyError(self.slot, int(pid) if pid.isdigit() else None) from None
            if "does not exist" in text and "slot" in text:
                raise TerminalError(f"replication slot {self.slot!r} does not exist: run `tidemark outbox init`") from None
            raise
        self._relations, self._columns = {}, {}

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
        self._conn = self._cur = None

    def _message(self, timeout: float) -> pgoutput.Message | None:
        import psycopg2

        assert self._cur is not None
        try:
            msg = self._cur.read_message()
            if msg is None:
                select.select([self._cur], [], [], timeout)
                msg = self._cur.read_message()
                if msg is None:
                    return None
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            raise
        except psycopg2.DatabaseError as exc:  # e.g. "no COPY in progress": the stream under it is gone
            raise ReplicationLostError(f"replication stream lost: {str(exc).strip()}") from exc
        return pgoutput.decode(msg.payload)

    def next_transaction(self, timeout: float) -> SourceTransaction | None:
        """The next committed transaction that inserted outbox rows, or None if none arrived in ``timeout``.

        Transactions that reach the slot without outbox rows (other tables are not
        published, so normally none) are returned with no events, so their position can
        still be confirmed.
        """
        deadline = time.monotonic() + timeout
        begin: pgoutput.Begin | None = None
        events: list[OutboxEvent] = []
        size = 0
        while True:
            # Once a transaction has begun, its remaining messages are already on their way.
            wait = max(0.0, deadline - time.monotonic()) if begin is None else 5.0
            message = self._message(wait)
            if message is None:
                if begin is None:
                    return None
                continue
            if isinstance(message, pgoutput.Insert):
                if begin is None:
                    raise pgoutput.DecodeError("pgoutput insert outside a transaction")
                event = self._event(message)
                if event is not None:
                    events.append(event)
                    size += event.size
                    if len(events) > self.max_events or (self.max_bytes is not None and size > self.max_bytes):
                        raise self._too_large(begin, len(events), size)
            elif isinstance(message, pgoutput.Relation):
                self._relations[message.oid] = message
                self._columns.pop(message.oid, None)
            elif isinstance(message, pgoutput.Begin):
                begin, events, size = message, [], 0
            elif isinstance(message, pgoutput.Commit):
                if begin is None:
                    raise pgoutput.DecodeError("pgoutput commit without a begin")
                return SourceTransaction(begin.xid, message.commit_lsn, message.end_lsn, message.commit_time,
                                         tuple(events), size)

    def _too_large(self, begin: pgoutput.Begin, events: int, size: int) -> TransactionTooLargeError:
        limit = (f"relay.max_transaction_events={self.max_events}" if events > self.max_events
                 else f"relay.max_transaction_bytes={self.max_bytes}")
        return TransactionTooLargeError(
            f"source transaction {begin.xid} (commit LSN {pgoutput.format_lsn(begin.final_lsn)}) has more than "
            f"{limit} ({events} events, {size} bytes so far); nothing of it was relayed and the relay position did "
            "not move. Raise the limit (the relay holds one transaction in memory) and restart the relay.")

    def _event(self, insert: pgoutput.Insert) -> OutboxEvent | None:
        if insert.relation_oid in self._columns:
            layout = self._columns[insert.relation_oid]
        else:
            layout = self._columns[insert.relation_oid] = self._layout(insert.relation_oid)
        if layout is None:
            return None
        where, serialized = layout
        v = insert.values
        ident, aggregatetype, aggregateid, kind = v[where[0]], v[where[1]], v[where[2]], v[where[3]]
        if ident is None or aggregatetype is None or aggregateid is None or kind is None:
            raise TerminalError(f"outbox table {self.table}: an inserted row has NULL in id, aggregatetype, "
                                "aggregateid or type; those columns must be NOT NULL (`tidemark outbox init`)")
        payload = v[where[4]]
        if serialized and payload is not None:
            payload = _bytea(payload)
        return OutboxEvent(ident, aggregatetype, aggregateid, kind, payload, serialized)

    def _layout(self, oid: int) -> tuple[tuple[int, ...], bool] | None:
        """Where the outbox columns sit in the relation's tuples, and whether the payload is
        ``bytea``; None for another table."""
        relation = self._relations.get(oid)
        if relation is None:
            raise pgoutput.DecodeError(f"pgoutput insert for unknown relation {oid}")
        if (relation.namespace, relation.name) != (self.table.schema, self.table.name):
            return None
        missing = [c for c in OUTBOX_COLUMNS if c not in relation.columns]
        if missing:
            raise TerminalError(f"outbox table {self.table} lacks column(s) {', '.join(missing)}: "
                                "run `tidemark outbox init` or add them")
        where = tuple(relation.columns.index(c) for c in OUTBOX_COLUMNS)
        serialized = len(relation.types) == len(relation.columns) and relation.types[where[4]] == BYTEA_OID
        return where, serialized

    def confirm(self, lsn: int) -> None:
        """Tell the server everything up to ``lsn`` is done, so the slot can move past it."""
        assert self._cur is not None
        self._cur.send_feedback(flush_lsn=lsn, reply=True)
