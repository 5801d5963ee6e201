"""A transactional confluent-kafka producer whose errors arrive already classified.

librdkafka sorts every transactional error into kinds, and the caller's reaction depends
only on the kind (DESIGN.md section 5):

* retriable (a coordinator moving, a broker restarting): call the same method again, for
  up to ``retry_for`` seconds; past that the broker counts as *unavailable*
  (:class:`KafkaUnavailableError`, transient): the caller steps back and tries again
  later, it does not die. An outage is not a reason to stop a daemon;
* abortable (``txn_requires_abort``: a failed produce, a transaction timed out — which
  bumps the epoch and surfaces as ``INVALID_PRODUCER_EPOCH``, abortable, not a fence):
  abort (:class:`TransactionAbortedError`); the caller redoes the whole transaction from
  its source in a new producer epoch, after reading back what is committed;
* a commit whose outcome is unknown (``commit_transaction`` timed out or lost its
  connection): :class:`CommitOutcomeUnknownError`. Never redone blindly: the caller
  renews the producer (a fence, which completes or aborts that transaction on the
  broker) and reads back what it committed;
* fatal, including being fenced by a newer instance with the same ``transactional.id``:
  the producer is unusable; stop and exit non-zero.

:meth:`TransactionalProducer.run` applies that policy to one transaction body.

One more rule, because librdkafka speaks only the classic transaction protocol (no
KIP-890 "transactions v2", librdkafka issue #5423): a producer keeps its epoch from one
transaction to the next, so a request of transaction T1 that the broker handles late
(a produce or EndTxn retried across a broker restart or a cut connection) can land in
T2, merging two transactions or committing T2 early. After any sign of such a
disturbance — an error event from the client, a retried or aborted call —
:attr:`TransactionalProducer.disturbed` says why, and the caller replaces the instance
with :meth:`TransactionalProducer.renew` before its next transaction: the new instance's
``init_transactions()`` bumps the epoch, and the broker rejects anything still in flight
from the old one. A renewal is a new fence, exactly like a restart: whatever the caller
derived from the topics before it (the relay's position) must be read again after it,
since another instance with the same id may have run in between.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.preflight import GRANT_HINT
from tidemark.errors import KafkaAccessError, TerminalError, TransientError

log = logging.getLogger(__name__)

_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}

#: Refusals by the authorizer: no retry, renewal or redo can mend them, only an ACL can.
_REFUSED = {KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "may not use transactional.id {tid!r}",
            KafkaError.TOPIC_AUTHORIZATION_FAILED: "may not write to {what}",
            KafkaError.CLUSTER_AUTHORIZATION_FAILED: "may not use idempotent or transactional produce (cluster "
                                                     "IdempotentWrite)"}

#: What ``on_delivery`` callbacks receive: (error or None, message).
Delivery = Callable[[Any, Any], None]


class ProducerFencedError(TerminalError):
    """A newer producer with the same transactional.id took over; this one must stop."""

    exit_code = 3


class ProducerFatalError(TerminalError):
    """The producer hit an error it cannot recover from."""


class KafkaUnavailableError(TransientError):
    """Kafka kept answering with retriable errors (or not at all) for longer than the retry window."""


class TransactionAbortedError(TransientError):
    """An abortable error ended the transaction (aborted); its work must be redone after a fence."""


class CommitOutcomeUnknownError(TransientError):
    """``commit_transaction`` failed without saying whether the transaction committed.

    The caller must renew the producer (fencing the transaction to an end on the broker)
    and read back what it had committed; redoing the transaction blindly could write it twice.
    """


def _fatal(err: KafkaError, what: str, transactional_id: str) -> TerminalError:
    if err.code() in _REFUSED:
        return _refused(err, what, transactional_id)
    if err.code() in _FENCED:
        return ProducerFencedError(
            f"{what}: fenced by a newer producer with transactional.id {transactional_id!r} ({err.str()}); "
            "another instance with this id took over, so this one stops without writing anything more")
    return ProducerFatalError(f"{what}: fatal Kafka producer error {err.name()}: {err.str()}")


def _refused(err: KafkaError, what: str, transactional_id: str) -> KafkaAccessError:
    """One line naming the missing ACL and what to run (exit 77; never a fence, a retry or a redo)."""
    topic = what.removeprefix("producing to ") if what.startswith("producing to ") else "a topic of this transaction"
    denied = _REFUSED[err.code()].format(tid=transactional_id, what=topic)
    return KafkaAccessError(
        f"{what}: this Kafka principal {denied} ({err.name()}): {GRANT_HINT}")


class TransactionalProducer:
    def __init__(self, config: dict[str, Any], *, retry_for: float = 300.0) -> None:
        self.transactional_id = str(config["transactional.id"])
        self.retry_for = retry_for
        self.renewals = 0
        """How many times the instance was replaced after a disturbance (see the module docstring)."""
        self._config = {"enable.idempotence": True, "acks": "all", **config}
        self._disturbed: str | None = None
        self._init_timeout = 60.0
        self._producer = self._new_instance()

    def _new_instance(self) -> Producer:
        generation = self.renewals
        return Producer({**self._config, "error_cb": lambda err: self._on_error(err, generation)})

    def _on_error(self, err: KafkaError, generation: int | None = None) -> None:
        """librdkafka's error events: connection losses, brokers down, request timeouts.

        A fatal one (being fenced included) is not a disturbance to renew after: the next
        call raises it, and the instance must stop, not fence its successor. Events of a
        replaced instance (its closing, say) say nothing about the current one.
        """
        if generation is not None and generation != self.renewals:
            return  # a replaced instance's events (its closing, its fencing) say nothing about this one
        if not err.fatal() and err.code() not in _FENCED:
            self._disturbed = self._disturbed or f"client error event {err.name()}"

    @property
    def disturbed(self) -> str | None:
        """Why the instance should be renewed before the next transaction, or None."""
        _serve(lambda: self._producer.poll(0))  # serve pending error events first
        return self._disturbed

    def renew(self) -> None:
        """Replace the instance with a new one, fenced in by ``init_transactions()`` (an epoch bump)."""
        log.warning("%s: Kafka connection disturbed (%s); replacing the producer so that a late request of a "
                    "past transaction cannot join the next one", self.transactional_id, self._disturbed)
        _destroy(self._producer, self.transactional_id)
        self.renewals += 1
        self._producer = self._new_instance()
        self._disturbed = None
        self.init(self._init_timeout)

    def _call(self, what: str, fn: Callable[[], None]) -> None:
        """Call a transactional method, repeating it while the error is retriable.

        The order of the checks matters: a transaction that timed out on the broker bumps
        the epoch, which surfaces as the abortable ``INVALID_PRODUCER_EPOCH``; it is an
        abort-and-redo, not a fence.
        """
        deadline = time.monotonic() + self.retry_for
        delay = 0.1
        while True:
            try:
                fn()
                return
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal() or err.code() in _REFUSED:
                    raise _fatal(err, what, self.transactional_id) from None
                if err.txn_requires_abort():
                    raise
                if err.code() in _FENCED:
                    raise _fatal(err, what, self.transactional_id) from None
                if not err.retriable():
                    raise ProducerFatalError(f"{what}: {err.name()}: {err.str()}") from None
                self._disturbed = self._disturbed or f"retriable {err.name()} in {what}"
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"{what}: Kafka answered {err.name()} ({err.str()}) for {self.retry_for:g} s") from None
                log.warning("%s: retriable error %s; retrying in %.1fs", what, err.name(), delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def init(self, timeout: float = 60.0) -> None:
        """``init_transactions()``: completes or aborts the previous instance's open transaction and fences it."""
        self._init_timeout = timeout
        self._call("init_transactions", lambda: self._producer.init_transactions(timeout))
        _serve(lambda: self._producer.poll(0))
        self._disturbed = None  # whatever happened before the fence cannot reach past it

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, str | bytes | None]] | None = None, partition: int = -1,
                on_delivery: Delivery | None = None) -> None:
        self.produce_all(((topic, partition, key, value, headers, on_delivery),))

    def produce_all(self, messages: Iterable[tuple[str, int, bytes | None, bytes | None,
                                                   list[tuple[str, str | bytes | None]] | None, Delivery | None]]
                    ) -> None:
        """Produce each (topic, partition or -1, key, value, headers, on_delivery) in order, in one loop:
        the relay's per-event path, without a Python call per event around librdkafka's."""
        produce = self._producer.produce
        for topic, partition, key, value, headers, on_delivery in messages:
            while True:
                try:
                    if on_delivery is None:
                        produce(topic, value, key, partition, headers=headers)
                    else:
                        produce(topic, value, key, partition, on_delivery=on_delivery, headers=headers)
                    break
                except BufferError:
                    _serve(lambda: self._producer.poll(0.05))  # queue full: let deliveries drain
                except KafkaException as exc:
                    err: KafkaError = exc.args[0]
                    if err.fatal() or err.code() == KafkaError._FATAL:  # produce()'s errors carry no fatal flag
                        raise _fatal(self._cause(err), f"producing to {topic}", self.transactional_id) from None
                    raise

    def serve(self) -> None:
        """Run the callbacks of the delivery reports that have arrived, without waiting."""
        _serve(lambda: self._producer.poll(0))

    def flush(self, timeout: float) -> None:
        """Wait for every produced message's delivery report (their callbacks run here)."""
        deadline = time.monotonic() + timeout
        while _serve(lambda: self._producer.flush(max(0.0, min(1.0, deadline - time.monotonic())))) > 0:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"{self.transactional_id}: messages not delivered within {timeout:g} s")

    def run(self, body: Callable[[TransactionalProducer], None], *, what: str, timeout: float = 60.0) -> None:
        """Run ``body`` (which produces) inside one transaction and commit it.

        An abortable error aborts the transaction and raises :class:`TransactionAbortedError`;
        a commit whose outcome is unknown raises :class:`CommitOutcomeUnknownError`. Both
        are the caller's to settle, never redone here: a redo belongs in a new producer
        epoch, after a fence that may have found another instance's work, so only the
        caller, which can read back what is committed, knows what is left to do.
        """
        self.begin()
        self.within(body, what=what, commit=True, timeout=timeout)

    def begin(self) -> None:
        """Open a transaction that :meth:`within` calls then add to and, last, commit."""
        self._call("begin_transaction", self._producer.begin_transaction)

    def within(self, step: Callable[[TransactionalProducer], None], *, what: str, commit: bool = False,
               timeout: float = 60.0) -> None:
        """Run ``step`` inside the open transaction, then commit it if ``commit``; errors as :meth:`run` says."""
        try:
            step(self)
            if not commit:
                return
            try:
                self._producer.commit_transaction(timeout)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal() or err.txn_requires_abort() or (err.code() in _FENCED):
                    raise
                self._disturbed = f"commit outcome unknown ({err.name()})"
                raise CommitOutcomeUnknownError(
                    f"{what}: commit_transaction failed with {err.name()} ({err.str()}); outcome unknown") from None
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or not err.txn_requires_abort() or err.code() in _REFUSED:
                raise _fatal(self._cause(err), what, self.transactional_id) from None
            self._disturbed = self._disturbed or f"abortable {err.name()} in {what}"
            self.abort(timeout)
            raise TransactionAbortedError(f"{what}: transaction aborted by {err.name()} ({err.str()})") from None
        except SystemError as exc:
            self._settle_unexplained(exc, what, timeout)

    def _cause(self, err: KafkaError) -> KafkaError:
        """The error that made the instance fatal, where ``err`` is only librdkafka's generic ``_FATAL``.

        ``produce()`` on an instance that has just been fenced answers ``_FATAL`` ("Unable to
        produce message"), which hides the fence (exit 3) behind a generic fatal error. A
        transactional call on a fatal instance raises the stored cause itself (``_FENCED``,
        say), without a request to the broker, so an abort asks for it.
        """
        if err.code() != KafkaError._FATAL:
            return err
        try:
            self._producer.abort_transaction(1.0)
        except KafkaException as exc:
            cause: KafkaError = exc.args[0]
            if cause.fatal() and cause.code() != KafkaError._FATAL:
                return cause
        return err

    def _settle_unexplained(self, exc: SystemError, what: str, timeout: float) -> None:
        """A call failed inside the transaction with a ``SystemError`` and no Kafka error at all.

        confluent-kafka does this when the instance turns fatal (fenced) while it serves
        delivery reports and it loses the error on the way (``returned NULL without setting an
        exception``; see :func:`_serve` for the variant that keeps it). The instance's state
        says what happened: aborting the transaction raises the fatal error if there is one,
        which then ends the caller as it should; if the abort succeeds, nothing was fatal and
        the transaction is simply redone, like any abortable error, in a renewed instance.
        """
        try:
            self._producer.abort_transaction(timeout)
        except KafkaException as abort_exc:
            err: KafkaError = abort_exc.args[0]
            if err.fatal() or err.code() in _FENCED or err.code() in _REFUSED:
                raise _fatal(err, what, self.transactional_id) from None
            raise ProducerFatalError(f"{what}: the Kafka client failed ({exc}), then its abort failed with "
                                     f"{err.name()} ({err.str()})") from None
        self._disturbed = f"the Kafka client failed without an error in {what}"
        raise TransactionAbortedError(f"{what}: the Kafka client failed without an error ({exc}); the transaction "
                                      "was aborted to be redone") from None

    def abort(self, timeout: float = 60.0) -> None:
        """Abort the open transaction (what it produced is never visible to read_committed readers)."""
        self._call("abort_transaction", lambda: self._producer.abort_transaction(timeout))

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued, if the instance still can, then destroy the instance.

        Destroying matters: a librdkafka instance left alive keeps asking for its producer
        id in the background, and when the broker is back it fences whichever instance with
        the same ``transactional.id`` its owner has made since (a relay stepping back through
        an outage makes one per attempt, and was fenced by its own leftovers). Anything still
        queued belongs to a transaction that was not committed, so dropping it loses nothing.
        A fenced or failed instance has nothing left to deliver, and its error must not hide
        the one that ended its caller's work.
        """
        try:
            _serve(lambda: self._producer.flush(timeout))
        except KafkaException as exc:
            log.debug("%s: closing an instance in error: %s", self.transactional_id, exc.args[0])
        _destroy(self._producer, self.transactional_id)


def _serve(call: Callable[[], int]) -> int:
    """A librdkafka call that serves delivery reports, raising the Kafka error itself.

    When the instance turns fatal (fenced) while reports are being served, confluent-kafka
    can call the next report's callback with the fatal error already raised, and Python then
    reports a ``SystemError`` caused by that error: the caller's classification needs the cause.
    """
    try:
        return call()
    except SystemError as exc:
        if isinstance(exc.__cause__, KafkaException):
            raise exc.__cause__ from None
        raise


def _destroy(producer: Producer, transactional_id: str) -> None:
    """Purge and close a librdkafka instance now; an open transaction on it is aborted or left to the next fence."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "abort_transaction failed during close": expected here
        try:
            producer.purge()
            producer.close()
        except (KafkaException, RuntimeError) as exc:  # already closed, or in error: nothing left to end
            log.debug("%s: destroying the instance: %s", transactional_id, exc)
