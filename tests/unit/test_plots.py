"""Every figure the results page shows is stored in docs/bench and draws as a PNG; an unknown benchmark is refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import plots

DOCS = Path(__file__).resolve().parents[2] / "docs"
FIGURES = DOCS / "bench"

#: The results page's figures (docs/benchmarks.md), each named after its benchmark, and the
#: script that writes it.
SHOWN = {
    "ingest": "ingest_bench",
    "relay": "relay_bench",
    "relay-format": "relay_format_bench",
    "g3": "g3_bench",
    "freshness": "freshness_bench",
    "history": "history_bench",
    "history-s3": "history_bench",
    "status": "status_bench",
    "serve": "serve_bench",
    "s3": "s3_bench",
    "avro": "avro_bench",
}


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_stored_figures_draw(name: str, tmp_path: Path) -> None:
    data = json.loads((FIGURES / f"{name}.json").read_text())
    assert data["benchmark"] == SHOWN[name]
    out = tmp_path / "chart.png"
    plots.save(data, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000
    stored = FIGURES / f"{name}.png"
    assert stored.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and stored.stat().st_size > 5_000


def test_the_page_shows_exactly_the_stored_figures() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    linked = set(re.findall(r"\(bench/([\w.-]+)\)", page))
    expected = {f"{name}.{ext}" for name in SHOWN for ext in ("json", "png")}
    assert linked == expected
    assert {p.name for p in FIGURES.iterdir()} == expected


def test_an_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no chart for benchmark 'mystery'.*relay_bench"):
        plots.save({"benchmark": "mystery"}, tmp_path / "x.png")
    plots.save({"benchmark": "mystery"}, None)  # no path: nothing drawn, nothing refused
