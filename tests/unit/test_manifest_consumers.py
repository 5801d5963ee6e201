"""The manifest's consumers kept between runs of one process (pipelines.transactions.consumers.ManifestConsumers.kept).

Pure pool logic: no consumer is made here (``get`` is never called), so no broker is needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.transactions.consumers import ManifestConsumers


@pytest.fixture(autouse=True)
def empty_pool() -> Iterator[None]:
    ManifestConsumers.close_idle()
    yield
    ManifestConsumers.close_idle()


def test_a_run_gets_the_consumers_the_last_run_with_the_same_settings_left() -> None:
    config = {"bootstrap.servers": "b:1", "sasl.password": "one"}
    with ManifestConsumers.kept(config) as first:
        pass
    with ManifestConsumers.kept(dict(reversed(list(config.items())))) as second:
        assert second is first
    with ManifestConsumers.kept({**config, "sasl.password": "two"}) as other:
        assert other is not first, "a changed credential must get new consumers"


def test_runs_at_the_same_time_never_share_consumers() -> None:
    config = {"bootstrap.servers": "b:1"}
    with ManifestConsumers.kept(config) as one, ManifestConsumers.kept(config) as two:
        assert one is not two
    with ManifestConsumers.kept(config) as again:
        assert again in (one, two)


def test_kept_consumers_are_closed_once_idle_long_enough() -> None:
    config = {"bootstrap.servers": "b:1"}
    with ManifestConsumers.kept(config) as first:
        pass
    assert ManifestConsumers.close_idle(older_than=3600) == 0, "closed before its time"
    with ManifestConsumers.kept(config) as again:
        assert again is first
    assert ManifestConsumers.close_idle(older_than=0) == 1
    with ManifestConsumers.kept(config) as fresh:
        assert fresh is not first


def test_a_certificate_replaced_in_place_gets_new_consumers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = tmp_path / "ca.pem"
    ca.write_text("old")
    config = {"bootstrap.servers": "b:1", "ssl.ca.location": str(ca)}
    with ManifestConsumers.kept(config) as first:
        pass
    ca.write_text("new")
    with ManifestConsumers.kept(config) as second:
        assert second is not first


def test_one_timer_closes_every_expired_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from pipelines.transactions import consumers

    monkeypatch.setattr(consumers, "KEPT_SECONDS", 0.2)
    before = threading.active_count()
    for n in range(5):
        with ManifestConsumers.kept({"bootstrap.servers": f"b:{n}"}):
            pass
    assert threading.active_count() <= before + 1, "a timer per run"
    for _ in range(50):  # up to 2.5 s for the timer's 0.2 s
        if not ManifestConsumers._idle:
            break
        time.sleep(0.05)
    assert not ManifestConsumers._idle, "kept consumers outlived KEPT_SECONDS"
