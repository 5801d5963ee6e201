"""Every benchmark JSON in docs/bench draws as a PNG; an unknown benchmark is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plots

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench"


@pytest.mark.parametrize("source", sorted(DOCS.glob("*.json")), ids=lambda p: p.stem)
def test_stored_figures_draw(source: Path, tmp_path: Path) -> None:
    data = json.loads(source.read_text())
    out = tmp_path / "chart.png"
    plots.save(data, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_an_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no chart for benchmark 'mystery'.*relay_bench"):
        plots.save({"benchmark": "mystery"}, tmp_path / "x.png")
    plots.save({"benchmark": "mystery"}, None)  # no path: nothing drawn, nothing refused
