"""Pure decisions of the relay: is the database the position's stream (outbox.source), how the
producer classifies a transactional error (connectors.producer), the collector's threshold while
groups are held (outbox.grouping), the backoff after outages (outbox.outage) and the resume's
settling window (outbox.relay)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.producer import (
    KafkaUnavailableError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionalProducer,
)
from outbox.admission import Admission
from outbox.position import Position, PositionUnreadableError, Source, resumed
from outbox.relay import Relay
from outbox.source import Slot, SourceChangedError, verify

HERE = Source("7000", 3, "tidemark_outbox")
SLOT = Slot("tidemark_outbox", True, confirmed_flush_lsn=900)


def _at(lsn: int, source: Source | None = HERE) -> Position:
    return Position(lsn, 1, "-", source)


def test_the_same_stream_passes() -> None:
    verify(_at(1000), HERE, SLOT)
    verify(None, HERE, SLOT)  # a relay that never relayed
    verify(_at(1000, None), HERE, SLOT)  # a position written before streams were recorded


@pytest.mark.parametrize(("position", "slot", "fork", "match"), [
    (_at(1000, Source("6999", 3, "s")), SLOT, None, "system 6999.*this server is system 7000"),
    (_at(1000, Source("7000", 2, "s")), SLOT, 800, "timeline 2, which is left at 0/320 for this server's timeline 3"),
    (_at(1000, Source("7000", 2, "s")), SLOT, None, "not an ancestor"),
    (_at(1000, Source("7000", 4, "s")), SLOT, None, "timeline 4"),
    (_at(1000), Slot("tidemark_outbox", False), None, "does not exist"),
    (None, Slot("tidemark_outbox", False), None, "does not exist"),
    # A re-initialised database has lost the slot too; the cause is named, not the symptom.
    (_at(1000, Source("6999", 3, "s")), Slot("tidemark_outbox", False), None, "re-initialised or replaced"),
    (_at(1000, Source("7000", 4, "s")), Slot("tidemark_outbox", False), None, "timeline 4"),
    (_at(1000), Slot("tidemark_outbox", True, 900, invalid="wal_removed"), None, "invalidated.*wal_removed"),
    (_at(800), Slot("tidemark_outbox", True, 900, stranded=2, stranded_example="e-1"), None,
     "confirmed 0/384, the relay's position 0/320.*passed 2 outbox row.*e-1"),
])
def test_another_stream_is_refused(position: Position | None, slot: Slot, fork: int | None, match: str) -> None:
    with pytest.raises(SourceChangedError, match=match) as raised:
        verify(position, HERE, slot, fork)
    assert "--reset-relay" in str(raised.value)


def test_a_slot_confirmed_past_the_position_without_passed_rows_is_followed() -> None:
    """psycopg2 moves an idle slot to the server's WAL end on keepalives; nothing was skipped."""
    verify(_at(800), HERE, SLOT)


def test_a_failover_after_the_position_is_followed() -> None:
    verify(_at(1000, Source("7000", 2, "s")), HERE, SLOT, fork=1000)


def _raising(*errors: KafkaError):  # type: ignore[no-untyped-def]
    pending = list(errors)

    def call() -> None:
        if pending:
            raise KafkaException(pending.pop(0))
    return call


def _producer(retry_for: float = 0.3) -> TransactionalProducer:
    return TransactionalProducer({"bootstrap.servers": "127.0.0.1:9", "transactional.id": "t"}, retry_for=retry_for)


def test_an_epoch_bump_from_a_transaction_timeout_is_abortable_not_fenced() -> None:
    bumped = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, txn_requires_abort=True)
    with pytest.raises(KafkaException) as raised:
        _producer()._call("commit_transaction", _raising(bumped))
    assert raised.value.args[0].txn_requires_abort()  # the caller aborts and redoes it


def test_fenced_and_fatal_stop_and_an_outage_is_transient() -> None:
    with pytest.raises(ProducerFencedError):
        _producer()._call("commit", _raising(KafkaError(KafkaError._FENCED, fatal=True)))
    with pytest.raises(ProducerFencedError):
        _producer()._call("commit", _raising(KafkaError(KafkaError.PRODUCER_FENCED)))
    with pytest.raises(ProducerFatalError):
        _producer()._call("commit", _raising(KafkaError(KafkaError.INVALID_CONFIG)))
    down = [KafkaError(KafkaError._TRANSPORT, retriable=True)] * 50
    with pytest.raises(KafkaUnavailableError, match="for 0.3 s"):
        _producer()._call("begin", _raising(*down))
    _producer(retry_for=10)._call("begin", _raising(*down[:2]))  # retried, then fine


def test_the_relay_raises_the_young_gc_threshold_only_while_it_runs() -> None:
    import gc

    from outbox.grouping import YOUNG_GC_THRESHOLD, collector_for_groups

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, *before[1:])
        with pytest.raises(RuntimeError), collector_for_groups():
            assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *before[1:])
            raise RuntimeError("a failed session")
        assert gc.get_threshold() == (700, *before[1:])
        gc.set_threshold(10 * YOUNG_GC_THRESHOLD, *before[1:])  # a caller's higher threshold is kept
        with collector_for_groups():
            assert gc.get_threshold()[0] == 10 * YOUNG_GC_THRESHOLD
    finally:
        gc.set_threshold(*before)


def test_a_relay_never_resumes_from_a_position_older_than_one_it_knew() -> None:
    """An unsettled offsets topic (a broker just paused or restarted) may answer an older position or none;
    the slot would resend what Kafka holds and it would go again, so the answer is not acted on."""
    with pytest.raises(PositionUnreadableError, match="0/3E7, older than 0/3E8"):
        resumed(_at(1000), _at(999), "t.offsets")
    with pytest.raises(PositionUnreadableError, match=r"\(none\), older than 0/3E8"):
        resumed(_at(1000), None, "t.offsets")
    assert resumed(_at(1000), _at(1000), "t") == _at(1000)
    assert resumed(_at(1000), _at(1200), "t") == _at(1200)
    assert resumed(None, None, "t") is None  # a first start
    # Another stream's position (a reset relay, another database) is not compared: verify() judges it.
    other = _at(10, Source("6999", 1, "s"))
    assert resumed(_at(1000), other, "t") == other


def test_the_back_off_starts_over_once_the_relay_has_relayed_again() -> None:
    """Outages back off 1, 2, 4 ... 30 s while one goes on; one that follows relayed groups is a new
    outage and waits 1 s again (before, a relay running for months waited 30 s at every blip)."""
    from tidemark.config import RelayConfig

    relay = Relay(RelayConfig(), dsn="", client_config={})
    sessions = iter([0, 0, 0, 3, 0, 5])  # groups each session commits before Kafka goes away again

    def session(stop: threading.Event, idle_exit: float | None) -> None:
        relayed = next(sessions, None)
        if relayed is None:
            return
        relay.report.kafka_transactions += relayed
        raise KafkaUnavailableError("down")

    waits: list[float] = []

    class Clock(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(float(timeout or 0))
            return False

    stop = Clock()
    relay._session = session  # type: ignore[method-assign]
    relay.run(stop)
    assert waits == [1.0, 2.0, 4.0, 1.0, 2.0, 1.0]


def test_an_older_position_is_believed_only_after_the_settling_window(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Refused while the topic may be settling (the read's own wait: 2 x the transaction timeout + 30 s);
    still older after that, it is the truth (a commit Kafka acknowledged is not there), and resuming from
    it lets the slot resend what it has: an alert, not a relay stuck for ever."""
    import outbox.relay as relay_module
    from tidemark.config import RelayConfig

    relay = Relay(RelayConfig(transaction_timeout_ms=10_000), dsn="", client_config={})
    relay.position = _at(1000)
    clock = [100.0]
    monkeypatch.setattr(relay_module, "read_position", lambda *a, **k: _at(900))
    # The relay module's name for the clock, not the process-wide time module other threads run on.
    monkeypatch.setattr(relay_module, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep))
    monkeypatch.setattr(Admission, "partitions", lambda self, topic: 1)
    for seconds in (0, 20, 49.9):
        clock[0] = 100 + seconds
        with pytest.raises(PositionUnreadableError):
            relay._resume()
        assert relay.position == _at(1000)
    clock[0] = 150.5
    relay._resume()
    assert relay.position == _at(900)
    assert "ALERT" in caplog.text and "0/384" in caplog.text


@pytest.mark.parametrize(("fields", "message"), [
    ({"schemas": {"orders": "orders.avsc"}}, "apply to format: avro"),
    ({"format": "avro", "auto_register": True}, "registers the files of relay.schemas"),
])
def test_schema_files_and_auto_register_need_avro_and_files(fields: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    from tidemark.config import RelayConfig

    with pytest.raises(ValidationError, match=message):
        RelayConfig(**fields)  # type: ignore[arg-type]


def test_a_schema_file_that_is_not_avro_is_named_before_anything_is_relayed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from outbox.avro import _schema_text
    from tidemark.errors import ConfigError

    bad = tmp_path / "orders.avsc"
    bad.write_text('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}')
    with pytest.raises(ConfigError, match=r"orders\.avsc is not an Avro schema"):
        _schema_text("orders", bad)
    with pytest.raises(ConfigError, match="cannot read"):
        _schema_text("orders", tmp_path / "missing.avsc")
