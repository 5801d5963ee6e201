"""The floors hold: the ground package imports nothing above it, and no import runs up or round."""

from __future__ import annotations

from tests import layers


def test_every_import_runs_down_the_floors() -> None:
    wrong = layers.upward(layers.edges())
    assert not wrong, "imports that run upward or across (python -m tests.layers):\n" + "\n".join(
        f"{e.source} -> {e.target} (line {e.line})" for e in wrong)


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert layers.cycles(layers.edges()) == []


def test_the_reader_sees_an_upward_import_and_a_cycle() -> None:
    # The rule is only as good as the reading: one import up and one pair in a circle must show.
    up = layers.Edge("tidemark.config", "pipelines.ingest", 1)
    assert layers.upward([up, layers.Edge("pipelines.ingest", "tidemark.config", 1)]) == [up]
    loop = [layers.Edge("infra.a", "infra.b", 1), layers.Edge("infra.b", "infra.a", 2)]
    assert layers.cycles(loop) == [["infra.a", "infra.b"]]


def test_the_reader_finds_the_known_imports() -> None:
    found = {(e.source, e.target) for e in layers.edges()}
    assert ("tidemark.cli.main", "tidemark.settings") in found
    assert ("infra.spark", "infra.classpath") in found
