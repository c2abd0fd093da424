"""A trial whose loss becomes NaN or infinite fails at once with the reason; the
worker stays healthy and the run's other trials complete."""

from __future__ import annotations

import math
from pathlib import Path

import explore
from explore.scheduler.worker import diverged


def test_the_reason_names_the_loss_and_the_round() -> None:
    assert diverged(math.inf, "validation", 3) == "diverged: validation loss inf at round 3"
    assert diverged(0.5, "training", 1) is None


def test_a_huge_learning_rate_fails_its_trials_and_the_run_goes_on(tmp_path: Path) -> None:
    space = {"name": "d", "dataset": "digits", "keep_models": 0, "pruner": "none",
             "sampler": {"name": "random", "seed": 1},
             "budget": {"trials": 6, "rounds": 2, "memory": "400MB", "workers": 1},
             "training": {"optimizer": "sgd", "lr": {"choice": [1.0e6, 0.05]}}}
    study = explore.run(space, storage=f"sqlite:///{tmp_path}/d.db")
    by_lr: dict[float, list[object]] = {}
    for t in study.trials:
        by_lr.setdefault(t.params["lr"], []).append(t)
    assert set(by_lr) == {1.0e6, 0.05}
    for t in by_lr[1.0e6]:
        assert t.state.name == "FAIL"
        reason = t.user_attrs["explore"]["fail_reason"]  # RECORD_ATTR
        assert reason == "diverged: training loss nan at round 1"
    assert all(t.state.name == "COMPLETE" for t in by_lr[0.05])


def test_each_trial_trains_the_parameters_it_is_stored_with(tmp_path: Path) -> None:
    """A space of two points and more trials than points: draws that repeat a point are
    made again, and the trial trains the last draw, the one stored (it trained the first
    while the study showed the last)."""
    space = {"name": "d", "dataset": "digits", "keep_models": 0, "pruner": "none",
             "sampler": {"name": "random", "seed": 3},
             "budget": {"trials": 6, "rounds": 1, "memory": "400MB", "workers": 1},
             "model": {"depth": 1, "width": {"choice": [4, 48]}}}
    study = explore.run(space, storage=f"sqlite:///{tmp_path}/d.db")
    for t in study.trials:
        record = t.user_attrs["explore"]
        assert record["params"]["widths"] == [t.params["width"]]
        # the planned heap grows with the width: the trial compiled what it stored
        assert (record["total_bytes"] > 300_000) == (t.params["width"] == 48), record
