"""A metric is one module: a throwaway one, registered here, is an objective by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import optuna
import pytest

from explore import metrics
from explore.metrics import BaseMetric
from explore.space import parse_space
from explore.study import RECORD_ATTR
from explore.yamlio import SpaceError
from tests.explore.cli_run import run_here


class ErrorRate(BaseMetric):
    direction = "minimize"

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        return 1.0 - measured["accuracy"]


@pytest.fixture
def error_rate() -> Iterator[None]:
    metrics.register("error_rate")(ErrorRate)
    yield
    metrics.METRICS.unregister("error_rate")


SPACE = {"dataset": "digits", "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}}


def test_a_registered_metric_is_an_objective_by_name(error_rate: None) -> None:
    space = parse_space({**SPACE, "objectives": [{"metric": "error_rate"}]})
    (o,) = space.objectives
    assert o.dir == "minimize"
    assert metrics.get(o.metric).value({"accuracy": 0.75}, 0) == 0.25


def test_the_built_in_metrics() -> None:
    measured = {"accuracy": 0.5, "eval_loss": 1.5}
    assert [(n, m.direction, m.value(measured, 100)) for n, m in metrics.METRICS.items()] == \
        [("accuracy", "maximize", 0.5), ("loss", "minimize", 1.5),
         ("planned_bytes", "minimize", 100.0)]


def test_unknown_metrics_are_listed() -> None:
    with pytest.raises(SpaceError, match="'accuracy', 'loss' or 'planned_bytes'"):
        parse_space({**SPACE, "objectives": [{"metric": "error_rate"}]})


def test_the_scheduler_scores_trials_with_a_registered_metric(error_rate: None,
                                                              tmp_path: Path) -> None:
    """A whole run: the value Optuna stores for each trial is the metric's, here
    1 - accuracy of the trial's last round."""
    f = tmp_path / "s.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 2, rounds: 2, memory: 300MB, workers: 1}\n"
                 "sampler: {name: random, seed: 0}\ntraining: {lr: 0.05, batch_size: 32}\n"
                 "objectives: [{metric: error_rate}]\n")
    run_here(f)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    trials = study.get_trials()
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
    accuracy = [t.user_attrs[RECORD_ATTR]["accuracy"] for t in trials]
    np.testing.assert_allclose([t.value for t in trials], 1.0 - np.array(accuracy), rtol=1e-12)
