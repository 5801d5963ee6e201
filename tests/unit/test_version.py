"""``tidemark --version`` reports the installed distribution that pyproject.toml names."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from tidemark.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_the_one_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cli_main.DISTRIBUTION == project["name"]


def test_version_prints_the_installed_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"tidemark {version(cli_main.DISTRIBUTION)}\n"


def test_version_without_an_installed_distribution_says_how_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr("importlib.metadata.version", missing)
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["--version"])
    assert exited.value.code == 1
    assert "pip install -e ." in capsys.readouterr().err
