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
fenced relay with this id: that session is ended.

Here are the waits and the count of failed groups (:class:`Backoff`, :class:`RegistryWaits`),
objects the relay owns; the loop that runs sessions and what it does after each kind of
failure (re-fencing, reconnecting) are :meth:`outbox.relay.Relay.run`'s, beside the steps.
"""

from __future__ import annotations

import logging

from connectors.producer import ProducerFatalError
from outbox.payloads import RegistryOutage
from outbox.report import RelayReport

log = logging.getLogger("outbox.relay")  # the relay's log lines, under the relay's name

#: Failed attempts at the same group, each after a fence and a fresh position, before the relay gives up.
MAX_REDOS = 10


class RegistryWaits:
    """The relay's wait for a schema registry that does not answer a lookup: the outage named
    once (with the subject it asked for), then each wait, then the line that it answers again."""

    def __init__(self, report: RelayReport) -> None:
        self.report = report
        self.url = ""
        self.subject = ""

    def waiting(self, outage: RegistryOutage, delay: float) -> None:
        """Count and log a wait of ``delay`` seconds for the registry of ``outage``."""
        if not self.report.registry_down:
            self.report.registry_outages += 1
            self.report.registry_down = True
            self.url, self.subject = outage.url, outage.subject
            log.warning("schema registry unavailable: %s; nothing of the transaction is produced, the slot keeps "
                        "every transaction not yet acknowledged, and the relay resumes by itself once it answers",
                        outage)
        log.warning("waiting %.0f s for the schema registry at %s (subject %r)", delay, outage.url, outage.subject)

    def answered(self, topics: list[str]) -> None:
        """Step 4 encoded events of ``topics``: if the topic whose lookup the relay waited for is one,
        the registry answered it. (Others may be encoded with schemas the relay holds, the registry
        still down: the slot resends transactions committed before the one that waits.)"""
        if self.report.registry_down and self.subject.removesuffix("-value") in topics:
            self.report.registry_down = False
            log.warning("the schema registry at %s answers again; relaying resumes", self.url)


class Backoff:
    """How long the relay steps back after an outage (1 s, doubling up to 30 s, from 1 s again
    once a group has committed since), and when a group that keeps failing is given up on."""

    def __init__(self, report: RelayReport, registry: RegistryWaits) -> None:
        self.report = report
        self.registry = registry
        self._delay = 1.0
        self._relayed = 0
        """Kafka transactions committed when the current outage began."""
        self._redos = 0
        self._committed = -1
        """Kafka transactions committed when the current run of failed groups began."""

    def _next(self) -> float:
        if self.report.kafka_transactions != self._relayed:  # a new outage, not the same one going on
            self._delay, self._relayed = 1.0, self.report.kafka_transactions
        delay, self._delay = self._delay, min(self._delay * 2, 30.0)
        return delay

    def registry_down(self, outage: RegistryOutage) -> float:
        """The seconds to wait for a registry that did not answer (counted as the registry's outage)."""
        delay = self._next()
        self.registry.waiting(outage, delay)
        return delay

    def kafka_down(self, outage: Exception) -> float:
        """The seconds to wait for Kafka (counted as an outage)."""
        delay = self._next()
        self.report.outages += 1
        log.warning("Kafka unavailable (%s); the relay steps back for %.0f s and resumes by itself "
                    "(the slot keeps every transaction not yet acknowledged)", outage, delay)
        return delay

    def group_failed(self, error: Exception) -> None:
        """A group aborted or of unknown outcome: the relay fences again and reads its position back,
        unless the same group has failed more than :data:`MAX_REDOS` times in a row (then it stops)."""
        self._redos = 1 if self.report.kafka_transactions != self._committed else self._redos + 1
        self._committed = self.report.kafka_transactions
        if self._redos > MAX_REDOS:
            raise ProducerFatalError(f"the same group failed {self._redos} times in a row, last: {error}; "
                                     "check the broker logs, topic ACLs and limits") from error
        self.report.redone += 1
        log.warning("%s; fencing again and reading the position back before relaying anything more", error)
