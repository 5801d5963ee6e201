"""Committed outbox transactions from a logical replication slot, in commit order.

Why logical decoding and not a polling cursor: the server decodes a transaction only
once it has committed and sends transactions in commit order, each whole, between its
Begin and Commit. A cursor on a sequence id or a transaction id (even the ``xid8``
snapshot-xmin cursor, which never skips a late commit) orders by id, so two
transactions on one aggregate that commit in the opposite order of their ids would be
relayed in the wrong order for that key. The slot also keeps the server's WAL until
we confirm a position, so nothing is lost while the relay is down.

:class:`Capture` only reads and confirms; the relay decides what a position means.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from dataclasses import dataclass
from datetime import datetime

from outbox import pgoutput
from outbox.schema import OUTBOX_COLUMNS, TableName
from tidemark.errors import TerminalError, TransientError

log = logging.getLogger(__name__)


class SlotBusyError(TransientError):
    """Another connection (perhaps a fenced relay) is still streaming from the slot."""

    def __init__(self, slot: str, pid: int | None) -> None:
        self.pid = pid
        super().__init__(f"replication slot {slot!r} is in use by server process {pid or '?'}; "
                         "another relay with this id may still be running")


class TransactionTooLargeError(TerminalError):
    """A source transaction has more events than the relay may put in one Kafka transaction."""


@dataclass(frozen=True)
class OutboxEvent:
    id: str
    aggregatetype: str
    aggregateid: str
    type: str
    payload: str | None
    """The ``jsonb`` payload in PostgreSQL's text form, or None for SQL NULL."""


@dataclass(frozen=True)
class SourceTransaction:
    xid: int
    commit_lsn: int
    end_lsn: int
    """The slot position that confirms this transaction."""
    commit_time: datetime
    events: tuple[OutboxEvent, ...]


class Capture:
    """One replication connection streaming the outbox table's inserts from ``slot``."""

    def __init__(self, dsn: str, *, slot: str, publication: str, table: TableName,
                 max_events: int) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.table = table
        self.max_events = max_events
        self._conn = None
        self._cur = None
        self._relations: dict[int, pgoutput.Relation] = {}

    def open(self) -> None:
        import psycopg2
        from psycopg2.extras import LogicalReplicationConnection

        try:
            self._conn = psycopg2.connect(self.dsn, connection_factory=LogicalReplicationConnection)
            cur = self._conn.cursor()  # type: ignore[attr-defined]
            cur.start_replication(slot_name=self.slot, decode=False, status_interval=5, options={
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
        self._cur = cur
        self._relations = {}

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
        self._conn = self._cur = None

    def _message(self, timeout: float) -> pgoutput.Message | None:
        assert self._cur is not None
        msg = self._cur.read_message()
        if msg is None:
            select.select([self._cur], [], [], timeout)
            msg = self._cur.read_message()
            if msg is None:
                return None
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
        while True:
            # Once a transaction has begun, its remaining messages are already on their way.
            wait = max(0.0, deadline - time.monotonic()) if begin is None else 5.0
            message = self._message(wait)
            if message is None:
                if begin is None:
                    return None
                continue
            if isinstance(message, pgoutput.Relation):
                self._relations[message.oid] = message
            elif isinstance(message, pgoutput.Begin):
                begin, events = message, []
            elif isinstance(message, pgoutput.Insert):
                if begin is None:
                    raise pgoutput.DecodeError("pgoutput insert outside a transaction")
                event = self._event(message)
                if event is not None:
                    events.append(event)
                    if len(events) > self.max_events:
                        raise TransactionTooLargeError(
                            f"source transaction {begin.xid} (commit LSN {pgoutput.format_lsn(begin.final_lsn)}) "
                            f"has more than relay.max_transaction_events={self.max_events} events; nothing of it "
                            "was relayed and the relay position did not move. Raise relay.max_transaction_events "
                            "(the relay holds one transaction in memory) and restart the relay.")
            elif isinstance(message, pgoutput.Commit):
                if begin is None:
                    raise pgoutput.DecodeError("pgoutput commit without a begin")
                return SourceTransaction(begin.xid, message.commit_lsn, message.end_lsn, message.commit_time,
                                         tuple(events))

    def _event(self, insert: pgoutput.Insert) -> OutboxEvent | None:
        relation = self._relations.get(insert.relation_oid)
        if relation is None:
            raise pgoutput.DecodeError(f"pgoutput insert for unknown relation {insert.relation_oid}")
        if (relation.namespace, relation.name) != (self.table.schema, self.table.name):
            return None
        row = dict(zip(relation.columns, insert.values, strict=True))
        missing = [c for c in OUTBOX_COLUMNS if c not in row]
        if missing:
            raise TerminalError(f"outbox table {self.table} lacks column(s) {', '.join(missing)}: "
                                "run `tidemark outbox init` or add them")
        return OutboxEvent(id=str(row["id"]), aggregatetype=str(row["aggregatetype"]),
                           aggregateid=str(row["aggregateid"]), type=str(row["type"]), payload=row["payload"])

    def confirm(self, lsn: int) -> None:
        """Tell the server everything up to ``lsn`` is done, so the slot can move past it."""
        assert self._cur is not None
        self._cur.send_feedback(flush_lsn=lsn, reply=True)
