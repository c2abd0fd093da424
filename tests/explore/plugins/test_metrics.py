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
    measured = {"accuracy": 0.5, "loss": 1.5, "f1": 0.4, "roc_auc": 0.7, "rmse": 2.0,
                "mae": 1.0, "r2": 0.3, "train_seconds": 4.0}
    assert [(n, m.direction, m.value(measured, 100)) for n, m in metrics.METRICS.items()] == \
        [("accuracy", "maximize", 0.5), ("loss", "minimize", 1.5), ("f1", "maximize", 0.4),
         ("roc_auc", "maximize", 0.7), ("rmse", "minimize", 2.0), ("mae", "minimize", 1.0),
         ("r2", "maximize", 0.3), ("planned_bytes", "minimize", 100.0),
         ("train_seconds", "minimize", 4.0)]


def test_what_each_task_reports() -> None:
    assert metrics.reported("classification", 2) == ("accuracy", "loss", "f1", "roc_auc")
    assert metrics.reported("classification", 10) == ("accuracy", "loss", "f1")
    assert metrics.reported("regression", 0) == ("loss", "rmse", "mae", "r2")


def test_metrics_from_summed_statistics_match_scikit_learn() -> None:
    """Macro F1 and R² from per-batch sums, and ROC AUC from every row's score, equal
    scikit-learn's over the whole set (ties in the scores included)."""
    sk = pytest.importorskip("sklearn.metrics", reason="scikit-learn comes with the dev extra")
    from explore.metrics.evaluation import Evaluation, compute_all

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 300)
    pred = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 4, 300))
    counts = np.zeros((3, 4))
    for batch in np.array_split(np.arange(300), 7):  # added batch by batch
        p, t = pred[batch], labels[batch]
        counts += [np.bincount(p[p == t], minlength=4), np.bincount(p, minlength=4),
                   np.bincount(t, minlength=4)]
    ev = Evaluation(300, "classification", {}, {"class_counts": counts})
    assert compute_all(["f1"], ev)["f1"] == pytest.approx(
        sk.f1_score(labels, pred, average="macro"), rel=1e-12)
    y = rng.normal(size=200)
    yhat = y + rng.normal(scale=0.5, size=200)
    sums = np.zeros(4)
    for batch in np.array_split(np.arange(200), 5):
        d = yhat[batch] - y[batch]
        sums += [(d * d).sum(), np.abs(d).sum(), y[batch].sum(), (y[batch] ** 2).sum()]
    ev = Evaluation(200, "regression", {}, {"regression_sums": sums}, target_std=3.0)
    got = compute_all(["rmse", "mae", "r2"], ev)
    assert got["r2"] == pytest.approx(sk.r2_score(y, yhat), rel=1e-9)
    assert got["rmse"] == pytest.approx(3.0 * np.sqrt(sk.mean_squared_error(y, yhat)), rel=1e-9)
    assert got["mae"] == pytest.approx(3.0 * sk.mean_absolute_error(y, yhat), rel=1e-9)
    two = rng.integers(0, 2, 500)
    scores = np.round(rng.random(500) + 0.3 * two, 1).astype(np.float32)  # many ties
    ev = Evaluation(500, "classification", per_row={"positive_score": scores}, labels=two)
    assert compute_all(["roc_auc"], ev)["roc_auc"] == pytest.approx(
        sk.roc_auc_score(two, scores), rel=1e-12)


def test_unknown_metrics_are_listed() -> None:
    with pytest.raises(SpaceError, match="'planned_bytes' or 'train_seconds'"):
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
    accuracy = [t.user_attrs[RECORD_ATTR]["metrics"]["accuracy"] for t in trials]
    np.testing.assert_allclose([t.value for t in trials], 1.0 - np.array(accuracy), rtol=1e-12)
