"""The relay's spans from two delivery reports per partition (outbox.manifest.Placement): pure logic."""

from __future__ import annotations

import random

import pytest

from outbox.manifest import InterleavedError, Placement

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def _place(placement: Placement, txns: list[list[tuple[str, int]]]) -> list[tuple[tuple[str, int], int]]:
    placed = []
    for events in txns:
        spans = placement.open()
        placed += [(tp, placement.place(spans, tp)) for tp in events]
    return placed


def test_contiguous_offsets_give_every_transactions_exact_spans() -> None:
    placement = Placement()
    _place(placement, [[A0, A0, B0], [A0, A1], [A0]])
    # a0 holds indexes 0..3 at offsets 100..103; a1 and b0 one event each.
    spans = placement.resolve({A0: {0: 100, 3: 103}, A1: {0: 7}, B0: {0: 42}})
    assert spans == [(("a", 0, 100, 101, 2), ("b", 0, 42, 42, 1)),
                     (("a", 0, 102, 102, 1), ("a", 1, 7, 7, 1)),
                     (("a", 0, 103, 103, 1),)]


def test_a_foreign_record_between_ours_is_refused_unless_every_event_was_reported() -> None:
    placement = Placement()
    _place(placement, [[A0, B0], [A0]])
    reported = {A0: {0: 100, 1: 102}, B0: {0: 5}}  # offset 101 is someone else's
    with pytest.raises(InterleavedError) as refused:
        placement.resolve(reported)
    assert refused.value.topics == {"a"}
    # Resolved early (before the last reports), the spans are only as good as the verify after them.
    placement.resolve({A0: {0: 100}, B0: {0: 5}}, verify=False)
    with pytest.raises(InterleavedError):
        placement.verify(reported)
    exact = Placement(frozenset({"a"}))
    _place(exact, [[A0, B0], [A0]])
    assert exact.resolve({A0: {0: 100, 1: 102}, B0: {0: 5}}) == [(("a", 0, 100, 100, 1), ("b", 0, 5, 5, 1)),
                                                                 (("a", 0, 102, 102, 1),)]


def test_spans_match_a_report_per_event_on_random_groups() -> None:
    rng = random.Random(11)
    partitions = [A0, A1, B0, ("c", 2)]
    for _ in range(200):
        txns = [[rng.choice(partitions) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 30))]
        base = {tp: rng.randint(0, 10_000) for tp in partitions}
        placement = Placement()
        placed = _place(placement, txns)
        every = {tp: {i: base[tp] + i for t, i in placed if t == tp} for tp in placement.sent}
        reported = {tp: {i: o for i, o in offsets.items() if i in (0, placement.sent[tp] - 1)}
                    for tp, offsets in every.items()}
        expected = []
        cursor = 0
        for events in txns:  # the spans a report per event gives: min and max offset, and the count
            mine: dict[tuple[str, int], list[int]] = {}
            for tp, i in placed[cursor:cursor + len(events)]:
                mine.setdefault(tp, []).append(every[tp][i])
            cursor += len(events)
            expected.append(tuple(sorted((tp[0], tp[1], min(o), max(o), len(o)) for tp, o in mine.items())))
        assert placement.resolve(reported) == expected
        # The relay's early close: the firsts alone give the same spans, and the lasts then verify.
        firsts = {tp: {0: offsets[0]} for tp, offsets in reported.items()}
        assert placement.ready(firsts) and placement.resolve(firsts, verify=False) == expected
        placement.verify(reported)


def test_the_one_pass_manifest_is_byte_for_byte_resolve_then_encode() -> None:
    """Placement.encode (the relay's) against resolve + encode, on random groups with dead letters,
    an exact topic and gaps another producer left: the same record and summary bytes, or the same refusal."""
    from outbox.wire import encode

    rng = random.Random(29)
    partitions = [A0, A1, B0, ("c", 2), ("d\"q", 1)]
    for round_ in range(300):
        exact = frozenset({"b"}) if round_ % 3 == 0 else frozenset()
        placement = Placement(exact)
        txns = []  # (id, events, dead)
        for t in range(rng.randint(1, 25)):
            dead = rng.random() < 0.1
            n = rng.randint(1, 12)
            if not dead:
                _place(placement, [[rng.choice(partitions) for _ in range(n)]])
            txns.append((f"0/{rng.randint(1, 10**9):X}/{t}", n, dead))
        base = {tp: rng.randint(0, 10_000) for tp in partitions}
        gap = {tp: rng.random() < 0.05 for tp in partitions}  # a foreign record after index 0
        offsets = {tp: {i: base[tp] + i + (1 if gap[tp] and i > 0 else 0) for i in range(n)}
                   for tp, n in placement.sent.items()}
        reported = {tp: (got if tp[0] in exact else {i: o for i, o in got.items() if i in (0, len(got) - 1)})
                    for tp, got in offsets.items()}
        try:
            resolved = iter(placement.resolve(reported))
        except InterleavedError:
            with pytest.raises(InterleavedError):
                placement.encode("relay-1", "0/AB", txns, reported)
            continue
        expected = encode("relay-1", "0/AB", ((i, n, () if dead else next(resolved), dead) for i, n, dead in txns))
        assert placement.encode("relay-1", "0/AB", txns, reported) == expected


def test_the_manifest_is_not_resolved_early_without_every_first_offset_or_with_an_exact_topic() -> None:
    placement = Placement()
    _place(placement, [[A0, B0], [A0]])
    assert not placement.ready({A0: {0: 100}, B0: {}})  # b0's only report has not come
    assert placement.ready({A0: {0: 100}, B0: {0: 5}})
    exact = Placement(frozenset({"a"}))
    _place(exact, [[A0, B0], [A0]])
    assert not exact.ready({A0: {0: 100}, B0: {0: 5}})  # a's middle offsets come from reports only


def test_the_manifest_encoder_writes_what_json_dumps_writes() -> None:
    import json

    from outbox.wire import Manifest, ManifestEntry

    rng = random.Random(3)
    alphabet = ["a", "Z", "0", "/", ".", "-", '"', "\\", "é", "\n", " ", "~", "\x7f", "\x1f", "😀"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))

    for _ in range(2000):
        manifest = Manifest(text(), text(), tuple(
            ManifestEntry(text(), rng.randint(0, 99), tuple(
                (text(), rng.randint(0, 9), rng.randint(0, 10**12), rng.randint(0, 10**12), rng.randint(1, 50))
                for _ in range(rng.randint(0, 4))), rng.random() < 0.2)
            for _ in range(rng.randint(0, 5))))
        plain = {"v": 1, "relay": manifest.relay, "end_lsn": manifest.end_lsn, "txns": [
            {"id": e.txn, "events": e.events, "spans": [list(s) for s in e.spans],
             **({"dead_lettered": True} if e.dead_lettered else {})} for e in manifest.entries]}
        assert manifest.encode() == json.dumps(plain, separators=(",", ":")).encode()
        assert Manifest.decode(manifest.encode()) == manifest


def test_a_delivery_report_without_an_offset_redoes_the_transaction() -> None:
    """librdkafka reports a retried batch the broker already had as delivered, with no offset: the
    spans are unknown then, so the group must not commit (it is redone), and never crash on None."""
    from types import SimpleNamespace

    from connectors.producer import TransactionAbortedError
    from outbox.grouping import Group
    from outbox.relay import Relay

    def report(offset: int | None) -> SimpleNamespace:
        return SimpleNamespace(offset=lambda: offset, topic=lambda: "a")

    group = Group(placement=Placement())
    _place(group.placement, [[A0, A0]])
    group.offsets[A0] = {}
    group.delivered(A0, 0, None, report(None))
    group.delivered(A0, 1, None, report(-1001))
    assert group.unknown == 2 and group.offsets[A0] == {}
    assert not group.placement.ready(group.offsets)
    relay = SimpleNamespace(config=SimpleNamespace(transaction_timeout_ms=1000))
    producer = SimpleNamespace(flush=lambda timeout: 0)
    with pytest.raises(TransactionAbortedError, match="2 event.s. delivered without an offset"):
        Relay._await_deliveries(relay, producer, group)  # type: ignore[arg-type]
    group.unknown = 0
    group.delivered(A0, 0, None, report(100))
    group.delivered(A0, 1, None, report(101))
    Relay._await_deliveries(relay, producer, group)  # type: ignore[arg-type]
    assert group.placement.resolve(group.offsets) == [(("a", 0, 100, 101, 2),)]


def test_a_released_group_is_freed_by_reference_counting() -> None:
    """The relay collects rarely (YOUNG_GC_THRESHOLD): a committed group, with all its transactions,
    must not wait for the collector. Its report callbacks refer back to it; release() drops them."""
    import gc
    import weakref
    from functools import partial

    from outbox.grouping import Group

    def staged() -> Group:
        group = Group(placement=Placement())
        for tp in (A0, B0):
            group.offsets[tp] = {}
            group.held[tp] = (tp[0], tp[1], b"k", b"v", [], partial(group.delivered, tp, 0))
        group.unsent.append((A1[0], A1[1], b"k", b"v", [], partial(group.delivered, A1, 0)))
        return group

    enabled = gc.isenabled()
    gc.disable()
    try:
        kept, freed = staged(), staged()
        freed.release()
        kept_ref, freed_ref = weakref.ref(kept), weakref.ref(freed)
        del kept, freed
        assert freed_ref() is None
        assert kept_ref() is not None, "no cycle without release(): the test would prove nothing"
    finally:
        if enabled:
            gc.enable()
        gc.collect()
