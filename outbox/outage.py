"""Outages: Kafka, the schema registry or PostgreSQL lost and waited for, the same group failing
again, a relay re-fenced.

Why this is its own module: an outage is not a reason for the relay to stop, and none may
cost exactly-once (G4) or let a fenced relay commit (G5). Kafka unavailable: the relay steps
back, waits (1 s, doubling up to 30 s, from 1 s again once a group has committed since) and
resumes from step 1 of ``outbox.relay``. The schema registry not answering a lookup a payload
needs (``relay.format: avro``, ``protobuf``; :class:`outbox.payloads.RegistryOutage`): the same
wait, before anything of the transaction is produced, counted and logged as the registry's
(one line naming it and the subject, then one per wait, then one when it answers again). An
aborted group or a commit of unknown outcome: the relay fences again and reads its position
back before relaying anything more, and gives up once the same group has failed more than
:data:`MAX_REDOS` times in a row. PostgreSQL lost: the open group is aborted and, once the relay has checked that it still owns its id,
the session reconnects (the slot resends what was not acknowledged). A slot still held by a
fenced relay with this id: that session is ended. The protocol's steps, and what a crash
after each leaves, stay in ``outbox.relay``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from connectors.preflight import postgres_refusal
from connectors.producer import (
    CommitOutcomeUnknownError,
    KafkaUnavailableError,
    ProducerFatalError,
    TransactionAbortedError,
    TransactionalProducer,
)
from outbox.capture import Capture, SlotBusyError
from outbox.grouping import Group
from outbox.payloads import RegistryOutage
from outbox.position import Position, PositionUnreadableError
from outbox.report import RelayReport
from tidemark.config import RelayConfig
from tidemark.errors import ServiceUnavailableError

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name

#: Failed attempts at the same group, each after a fence and a fresh position, before the relay gives up.
MAX_REDOS = 10


class Outages:
    """The relay's part that rides out outages and fences again (a mixin of :class:`outbox.relay.Relay`,
    whose ``__init__`` sets the state named here)."""

    config: RelayConfig
    dsn: str
    transactional_id: str
    report: RelayReport
    position: Position | None
    _db: Any
    _pending_ids: list[bytes]
    _pending_lsn: int | None
    _unacked: int
    _offsets_partition: int
    _registry_url: str
    _registry_subject: str
    """The schema registry the relay waits for, and the subject it asked for (while ``report.registry_down``)."""
    _connect_db: Callable[[], Any]
    """The relay's own connection to the database (``outbox.relay``)."""
    _session: Callable[[threading.Event, float | None], None]
    """Steps 1-6 once (``outbox.relay``)."""
    _resume: Callable[[], None]
    """Step 2 (``outbox.relay``)."""

    def _run(self, stop: threading.Event, idle_exit: float | None) -> RelayReport:
        """Sessions (steps 1-6) until one ends by itself: after an outage the relay steps back and
        starts the next; after a failed group it starts the next at once (a fence, a fresh position)."""
        delay, redos, committed, relayed = 1.0, 0, -1, 0
        while not stop.is_set():
            try:
                self._session(stop, idle_exit)
                return self.report
            except RegistryOutage as outage:
                if self.report.kafka_transactions != relayed:  # a new outage, not the same one going on
                    delay, relayed = 1.0, self.report.kafka_transactions
                self._registry_waits(outage, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)
            except (KafkaUnavailableError, PositionUnreadableError, ServiceUnavailableError) as outage:
                if self.report.kafka_transactions != relayed:  # a new outage, not the same one going on
                    delay, relayed = 1.0, self.report.kafka_transactions
                self.report.outages += 1
                log.warning("Kafka unavailable (%s); the relay steps back for %.0f s and resumes by itself "
                            "(the slot keeps every transaction not yet acknowledged)", outage, delay)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)
            except (TransactionAbortedError, CommitOutcomeUnknownError) as error:
                redos = 1 if self.report.kafka_transactions != committed else redos + 1
                committed = self.report.kafka_transactions
                if redos > MAX_REDOS:
                    raise ProducerFatalError(f"the same group failed {redos} times in a row, last: {error}; "
                                             "check the broker logs, topic ACLs and limits") from error
                self.report.redone += 1
                log.warning("%s; fencing again and reading the position back before relaying anything more", error)
        return self.report

    def _registry_waits(self, outage: RegistryOutage, delay: float) -> None:
        """Count and log a wait for the schema registry: the outage named once, then each wait."""
        if not self.report.registry_down:
            self.report.registry_outages += 1
            self.report.registry_down = True
            self._registry_url, self._registry_subject = outage.url, outage.subject
            log.warning("schema registry unavailable: %s; nothing of the transaction is produced, the slot keeps "
                        "every transaction not yet acknowledged, and the relay resumes by itself once it answers",
                        outage)
        log.warning("waiting %.0f s for the schema registry at %s (subject %r)", delay, outage.url, outage.subject)

    def _registry_answered(self, topics: list[str]) -> None:
        """Step 4 encoded events of ``topics``: if the topic whose lookup the relay waited for is one,
        the registry answered it. (Others may be encoded with schemas the relay holds, the registry
        still down: the slot resends transactions committed before the one that waits.)"""
        if self._registry_subject.removesuffix("-value") in topics:
            self.report.registry_down = False
            log.warning("the schema registry at %s answers again; relaying resumes", self._registry_url)

    def _refence(self, producer: TransactionalProducer) -> None:
        """A new producer instance (epoch bump), then the position as the topics now say.

        Read again because the renewal is a fence like any restart's: a relay with this id
        started meanwhile may have moved the position, and it is now fenced in turn.
        """
        producer.renew()
        self.report.refenced += 1
        self._resume()

    def _probe_ownership(self, producer: TransactionalProducer) -> None:
        """Commit the current position again: a fenced relay fails here and stops (G5).

        A relay that has relayed nothing yet commits position 0, which skips nothing.
        """
        current = self.position or Position(0, 0, datetime.now(UTC).isoformat())
        producer.run(lambda p: p.produce(self.config.offsets_topic, key=self.config.id.encode(),
                                         value=current.to_json(self.config.id), partition=self._offsets_partition),
                     what="checking this relay still owns its id")

    def _postgres_lost(self, exc: Exception, producer: TransactionalProducer, capture: Capture | None,
                       group: Group, stop: threading.Event) -> None:
        """After a PostgreSQL error in a session: stop on a refusal, else close the capture, abort the open
        group, wait and check this relay still owns its id; the caller starts over with a new capture and
        group."""
        # PostgreSQL restarting or the session ended: reconnect and resume from the slot.
        # Unacknowledged transactions come again and are skipped by position. A refused
        # login or certificate (a password rotated under us) is no outage: it stops.
        refusal = postgres_refusal(exc, self.dsn)
        if refusal is not None:
            if group.open:
                producer.abort(self.config.transaction_timeout_ms / 1000)
            raise refusal from None
        log.warning("PostgreSQL connection lost (%s); reconnecting", str(exc).strip().splitlines()[0])
        if capture is not None:
            capture.close()
        if group.open:
            producer.abort(self.config.transaction_timeout_ms / 1000)  # its events come again
        self._db = None
        self._pending_ids, self._pending_lsn, self._unacked = [], None, 0
        stop.wait(1.0)
        # Still ours? A newer relay may have fenced us and ended our session.
        self._probe_ownership(producer)

    def _end_fenced_session(self, busy: SlotBusyError) -> None:
        """End the session holding the slot if it is a relay with this id (step 1 fenced it); else wait."""
        if not busy.pid:
            return
        with self._connect_db().cursor() as cur:
            cur.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (busy.pid,))
            row = cur.fetchone()
            if row is None:
                return  # gone already
            if row[0] != self.transactional_id:
                raise SlotBusyError(self.config.slot_name, busy.pid, holder=row[0])
            log.warning("slot %s held by server process %d (a fenced relay with this id); ending that session",
                        self.config.slot_name, busy.pid)
            cur.execute("SELECT pg_terminate_backend(%s)", (busy.pid,))

