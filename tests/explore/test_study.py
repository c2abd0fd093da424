"""Samplers and pruners from a space, sampling conditional and per-layer parameters,
the working copy of a study, and a two-objective run (accuracy and planned bytes)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from explore.binding import bind
from explore.live import LiveStudy, WriteFailed
from explore.results import load
from explore.sampling import fixed, suggest
from explore.space import parse_space
from explore.study import (
    make_pruner,
    make_sampler,
    open_study,
)
from tests.explore.cli_run import IN_TEST, explore_run

BASE = {"dataset": "digits", "budget": {"trials": 3, "rounds": 2, "memory": "300MB",
                                        "workers": 1},
        "model": {"depth": {"int": [1, 3]}, "width": {"choice": [8, 16], "per_layer": True}},
        "training": {"optimizer": {"choice": ["sgd", "adam"]},
                     "lr": {"choice": [0.01, 0.1]},
                     "momentum": {"choice": [0.5, 0.9], "when": {"optimizer": "sgd"}}}}


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "cmaes"])
def test_every_sampler_drives_the_space(sampler: str) -> None:
    space = parse_space({**BASE, "sampler": {"name": sampler, "seed": 0}})
    study = optuna.create_study(sampler=make_sampler(space), direction="maximize")
    for _ in range(6):
        t = study.ask()
        p = suggest(t, space)
        assert len(p["widths"]) == p["depth"] == len(p["activations"])
        assert (p["momentum"] in (0.5, 0.9)) == (p["optimizer"] == "sgd")
        assert ("momentum" in t.params) == (p["optimizer"] == "sgd")
        study.tell(t, float(p["lr"]))


@pytest.mark.parametrize(("name", "kind"), [("none", "NopPruner"), ("median", "MedianPruner"),
                                            ("successive_halving", "SuccessiveHalvingPruner"),
                                            ("hyperband", "HyperbandPruner")])
def test_pruners(name: str, kind: str) -> None:
    assert type(make_pruner(parse_space({**BASE, "pruner": name}))).__name__ == kind


def test_nsga2_for_several_objectives() -> None:
    space = parse_space({**BASE, "sampler": "nsga2", "objectives": [
        {"metric": "accuracy"}, {"metric": "planned_bytes"}]})
    assert type(make_sampler(space)).__name__ == "NSGAIISampler"
    assert [o.dir for o in space.objectives] == ["maximize", "minimize"]
    assert type(make_pruner(space)).__name__ == "NopPruner"  # no pruning with two


def test_fixed_parameters_and_overrides() -> None:
    space = parse_space(BASE)
    p = fixed(space, {"depth": 3, "width": [8, 16, 8]})
    assert p["depth"] == 3 and p["widths"] == [8, 16, 8] and len(p["activations"]) == 3
    with pytest.raises(ValueError, match="2 values for 3 layers"):
        fixed(space, {"depth": 3, "width": [8, 16]})
    with pytest.raises(KeyError, match="no parameter 'colour'"):
        fixed(space, {"colour": 1})


def test_the_working_copy_starts_from_the_stored_trials(tmp_path: Path) -> None:
    space = parse_space({**BASE, "name": "w"})
    stored = open_study(space, f"sqlite:///{tmp_path / 'w.db'}")
    t = stored.ask({"lr": optuna.distributions.FloatDistribution(0.01, 0.1)})
    stored.tell(t, 0.5)
    live = LiveStudy(stored, space, total=2, device="cpu")
    assert [x.value for x in live.work.trials] == [0.5]
    assert live.work.trials[0].params == {"lr": t.params["lr"]}
    live.close()


def test_a_two_objective_run(tmp_path: Path) -> None:


    f = tmp_path / "two.yaml"
    f.write_text("""\
dataset: digits
objectives: [{metric: accuracy}, {metric: planned_bytes}]
budget: {trials: 3, rounds: 1, memory: 300MB, workers: 1}
sampler: {name: nsga2, seed: 0}
pruner: none
model: {depth: 1, width: {choice: [8, 32]}}
training: {optimizer: adam, lr: 0.01, batch_size: 32}
""")
    result = explore_run(f)
    assert result.exit_code == 0, result.output
    df = load(f"sqlite:///{tmp_path / 'two.db'}", "two")
    assert (df["state"] == "complete").all() and len(df) == 3
    assert (df["value_1"] == df["total_bytes"]).all()
    assert df["value_0"].between(0, 1).all()


def test_results_are_written_in_order_and_a_failed_write_stops_the_run() -> None:
    space = parse_space({**BASE, "name": "order"})
    stored = optuna.create_study(study_name="order")
    live = LiveStudy(stored, space, total=3, device="cpu")
    for v in (3.0, 1.0, 2.0):
        claim = live.claim()
        assert claim is not None
        t = live.ask(claim, lambda trial: {"x": trial.suggest_float("x", 0, 1)})
        assert t is not None
        live.report(t, 1, v / 2)
        live.finish(t, v)
    assert live.claim() is None  # the study has its total
    live.close()
    assert [(t.value, t.intermediate_values) for t in stored.trials] == [
        (3.0, {1: 1.5}), (1.0, {1: 0.5}), (2.0, {1: 1.0})]

    class FullDisk(optuna.storages.InMemoryStorage):
        def set_trial_intermediate_value(self, trial_id: int, step: int,
                                         intermediate_value: float) -> None:
            raise OSError("No space left on device")

    broken = optuna.create_study(storage=FullDisk(), study_name="full")
    live = LiveStudy(broken, space, total=3, device="cpu")
    claim = live.claim()
    assert claim is not None
    t = live.ask(claim, lambda trial: {"x": trial.suggest_float("x", 0, 1)})
    assert t is not None
    live.report(t, 1, 0.5)
    with pytest.raises(WriteFailed, match="No space left on device"):
        live.flush()
    with pytest.raises(WriteFailed):
        live.close()


def test_trials_enqueued_in_the_storage_run_first_and_fill_their_stored_trial(
        tmp_path: Path) -> None:
    from explore.datasets import load_digits
    from explore.scheduler import Scheduler

    space = parse_space({**BASE, "name": "q", "pruner": "none"})
    storage = f"sqlite:///{tmp_path / 'q.db'}"
    stored = open_study(space, storage)
    for lr in (0.1, 0.01):
        stored.enqueue_trial({"depth": 1, "width_0": 8, "optimizer": "adam", "lr": lr})
    Scheduler(bind(space), stored, load_digits(), workers=1, memory=space.budget.memory,
              device="cpu", main=IN_TEST).run(3)
    trials = optuna.load_study(study_name="q", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3  # none left WAITING
    assert [t.params["lr"] for t in trials[:2]] == [0.1, 0.01]
    assert all(t.params["optimizer"] == "adam" and t.params["depth"] == 1 for t in trials[:2])
    assert all(len(t.intermediate_values) == 1 and "explore" in t.user_attrs for t in trials)
    df = load(storage, "q")
    assert (df["rounds"] == 2).all() and df.loc[0, "params"]["widths"] == [8]
