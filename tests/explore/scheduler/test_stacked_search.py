"""Stacked trials in the search (``budget.stack``): trials of one architecture and one
optimizer kind, asked together, run as one stacked program; each is still reported,
pruned, paused and kept on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from explore.binding import bind
from explore.candidate import graph_of
from explore.datasets import load_digits
from explore.results import load
from explore.sampling import fixed
from explore.scheduler import Scheduler
from explore.scheduler.stacking import Drawn, groups, means_only, stacks_for
from explore.space import Space, load_space, parse_space
from explore.study import open_study
from explore.trained import evaluate_split, load_model
from tests.explore.cli_run import IN_TEST, explore_run

SPACE = """\
name: st
dataset: digits
budget: {{trials: {trials}, rounds: 3, memory: 400MB, workers: 1, stack: 4}}
sampler: random
pruner: {pruner}
model: {{depth: 1, width: 16, activation: relu}}
training: {{optimizer: adam, lr: {{float: [1.0e-7, 3.0e-2], log: true}}, batch_size: 32}}
"""


def run(tmp_path: Path, lrs: list[float], pruner: str = "none") -> tuple[Scheduler, str]:
    f = tmp_path / "st.yaml"
    f.write_text(SPACE.format(trials=len(lrs), pruner=pruner))
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'st.db'}"
    study = open_study(space, storage)
    for lr in lrs:
        study.enqueue_trial({"lr": lr})  # asked in this order
    sched = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST)
    stats = sched.run(len(lrs))
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)
    return sched, storage


def records(storage: str) -> dict[int, dict]:
    study = optuna.load_study(study_name="st", storage=storage)
    return {t.number: t.user_attrs["explore"] for t in study.trials}


def test_each_member_of_a_stack_is_a_trial_of_its_own(tmp_path: Path) -> None:
    # one stack of four, run as a user runs it: the members that learn and the ones
    # whose rate is too small to learn anything are told apart, so each trial's metrics
    # are its own model's
    lrs = [1e-2, 1e-7, 3e-3, 2e-7]
    f = tmp_path / "st.yaml"
    f.write_text(SPACE.format(trials=len(lrs), pruner="none"))
    storage = f"sqlite:///{tmp_path / 'st.db'}"
    study = open_study(load_space(f), storage)
    for lr in lrs:
        study.enqueue_trial({"lr": lr})
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    rec = records(storage)
    assert [rec[n]["stack"]["model"] for n in range(4)] == [0, 1, 2, 3]
    assert {tuple(rec[n]["stack"]["trials"]) for n in range(4)} == {(0, 1, 2, 3)}
    df = load(storage, "st").set_index("number")
    assert (df["state"] == "complete").all() and (df["rounds"] == 3).all()
    acc = df["accuracy"]
    assert acc[0] > 0.8 and acc[2] > 0.8 and acc[1] < 0.35 and acc[3] < 0.35, acc
    # a kept member is a model of its own: its weights, loaded alone, score what its
    # trial recorded on the validation rows
    valid = load_digits().valid
    kept = load_model(storage, "st", trial=0)
    assert evaluate_split(kept, valid.x, valid.y)["accuracy"] == pytest.approx(acc[0],
                                                                              abs=1e-6)


def test_a_paused_member_waits_apart_and_resumes(tmp_path: Path) -> None:
    # Successive halving (eta 4, first rung after round 1), as for trials alone.  Trial 0
    # is the run's first ask, alone (intake.draws), and goes on; of the stack of trials
    # 1-4, trial 1 is second best at the rung and is paused with the others, the stack
    # regrouped; once 9 trials reached the rung, the top 2 go on and trial 1 resumes from
    # where it paused.  The second stack is paused whole.
    lrs = [0.03, 0.003, 1e-6, 1.5e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6]
    sched, storage = run(tmp_path, lrs, "{name: successive_halving, warmup_rounds: 1}")
    df = load(storage, "st").set_index("number")
    assert df.loc[0, "state"] == "complete" and df.loc[0, "pauses"] == 0
    assert df.loc[1, "state"] == "complete" and df.loc[1, "rounds"] == 3
    assert (df.loc[2:, "state"] == "pruned").all() and (df.loc[2:, "rounds"] == 1).all()
    assert (df.loc[1:, "pauses"] == 1).all()
    assert sched.stats.counts["resumed"] == 1 and sched.stats.counts["regrouped"] >= 1
    rec = records(storage)
    assert "stack" not in rec[0] and rec[1]["stack"]["trials"] == [1, 2, 3, 4]


def test_a_pruned_member_stops_costing_updates(tmp_path: Path) -> None:
    # A median pruner prunes the members that learn nothing; the survivors are stacked
    # again without them and finish.  (Trial 0, the run's first ask, runs alone.)
    lrs = [0.02, 0.003, 0.005, 0.004, 0.006, 0.03, 1e-7, 2e-7, 0.025]
    sched, storage = run(tmp_path, lrs, "{name: median, warmup_rounds: 1}")
    df = load(storage, "st").set_index("number")
    assert set(df.loc[[6, 7], "state"]) == {"pruned"}
    assert (df.loc[df["state"] == "complete", "rounds"] == 3).all()
    survivors = [n for n in (5, 8) if df.loc[n, "state"] == "complete"]
    assert survivors
    # Whether the regroup reaches the worker before the stack's last round ends depends
    # on timing (an ungated stack runs on while the pruner decides): the decision itself
    # is tested on the core (tests/explore/scheduler/test_core.py); here, a move made is
    # into a program of fewer members, the survivors among them.
    rec = records(storage)
    for n in survivors:
        moves = rec[n].get("moves", [])
        assert len(moves) <= sched.stats.counts.get("regrouped", 0)
        assert all(len(survivors) <= m["models"] < 4 for m in moves)


def test_the_last_trials_are_stacked_for_every_worker(tmp_path: Path) -> None:
    # Eight trials of one architecture and optimizer, stacks of up to four, two workers:
    # the first ask takes half of them (four), and the four left are split among the
    # workers (two, then one and one) rather than asked as one stack that one worker
    # trains alone while the other waits.
    f = tmp_path / "st.yaml"
    f.write_text(SPACE.format(trials=8, pruner="none").replace("workers: 1", "workers: 2"))
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'st.db'}"
    study = open_study(space, storage)
    for lr in np.geomspace(1e-3, 2e-2, 8):
        study.enqueue_trial({"lr": float(lr)})
    sched = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST)
    stats = sched.run(8)
    assert all(s.heaps + s.fixed <= stats.budget for s in stats.timeline)
    rec = records(storage)
    stacks = sorted({tuple(r["stack"]["trials"]) for r in rec.values() if "stack" in r},
                    key=len, reverse=True)
    assert [len(s) for s in stacks] == [4, 2], stacks
    assert stacks[0] == (0, 1, 2, 3)  # the first ask, in the queue's order
    assert sum("stack" not in r for r in rec.values()) == 2  # the last two alone
    df = load(storage, "st")
    assert (df["state"] == "complete").all() and (df["rounds"] == 3).all()


def space_of(**training: object) -> Space:
    return parse_space({"dataset": "digits", "budget": {"trials": 4, "rounds": 1,
                        "memory": "64MB", "stack": 4},
                        "model": {"depth": 1, "width": 8},
                        "training": {"optimizer": "adam", "batch_size": 16, **training}})


def drawn(space: Space, **params: object) -> Drawn:
    p = {**fixed(space), **params}
    return Drawn(None, p, graph_of(bind(space), p), False)


def test_candidates_group_by_architecture_optimizer_kind_and_batch() -> None:
    space = space_of()
    ds = [drawn(space, lr=0.1), drawn(space, lr=0.01), drawn(space, widths=[9]),
          drawn(space, optimizer="sgd"), drawn(space, batch_size=32), drawn(space, lr=0.5)]
    assert [[ds.index(d) for d in g] for g in groups(ds)] == [[0, 1, 5], [2], [3], [4]]


def test_sgd_trials_of_different_momenta_group_but_not_with_those_without() -> None:
    space = space_of(optimizer="sgd", momentum={"float": [0.0, 0.95]})
    ds = [drawn(space, lr=0.1, momentum=0.9), drawn(space, lr=0.01, momentum=0.3),
          drawn(space, momentum=0.0), drawn(space, lr=0.2, momentum=0.5)]
    assert [[ds.index(d) for d in g] for g in groups(ds)] == [[0, 1, 3], [2]]


def test_a_stack_of_sgd_trials_each_with_its_momentum_is_a_search(tmp_path: Path) -> None:
    f = tmp_path / "st.yaml"
    f.write_text(SPACE.format(trials=4, pruner="none").replace(
        "optimizer: adam", "optimizer: sgd, momentum: {float: [0.1, 0.95]}"))
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'st.db'}"
    study = open_study(space, storage)
    for lr, mu in [(0.02, 0.9), (0.005, 0.2), (0.03, 0.6), (0.01, 0.8)]:
        study.enqueue_trial({"lr": lr, "momentum": mu})
    Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
              device="cpu", main=IN_TEST).run(4)
    rec = records(storage)
    assert sorted(rec[n]["stack"]["model"] for n in range(4)) == [0, 1, 2, 3]  # one stack
    assert all(rec[n]["stack"]["models"] == 4 for n in range(4))
    trials = optuna.load_study(study_name="st", storage=storage).trials
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({t.value for t in trials}) > 1  # each its own model's accuracy


def test_only_objectives_made_of_means_stack() -> None:
    assert stacks_for(space_of())
    f1 = parse_space({"dataset": "digits", "budget": {"trials": 4, "rounds": 1,
                      "memory": "64MB", "stack": 4},
                      "objectives": [{"metric": "f1", "direction": "maximize"}]})
    assert not stacks_for(f1)
    g = graph_of(bind(space_of()), fixed(space_of()))
    kept = {o for p in means_only(g).paths for n in p.nodes for o in n.outputs}
    assert "class_counts" not in kept and {"accuracy", "eval_loss"} <= kept
    assert "class_counts" in {o for p in g.paths for n in p.nodes for o in n.outputs}


def test_stack_is_checked_in_the_space() -> None:
    from explore.yamlio import SpaceError

    with pytest.raises(SpaceError, match="stack"):
        parse_space({"dataset": "digits", "budget": {"trials": 4, "rounds": 1,
                     "memory": "64MB", "stack": 0}})
    assert np.int64(1) == parse_space({"dataset": "digits", "budget": {
        "trials": 1, "rounds": 1, "memory": "64MB"}}).budget.stack


def test_a_model_without_a_stacked_form_runs_its_trials_alone(tmp_path: Path) -> None:
    # a CNN's convolution has no stacking rule: the first group says so, and the run
    # asks one trial at a time from then on
    f = tmp_path / "st.yaml"
    f.write_text(SPACE.format(trials=4, pruner="none").replace(
        "model: {depth: 1, width: 16, activation: relu}",
        "model: {family: cnn, blocks: 1, channels: 4, depth: 0}").replace(
        "optimizer: adam", "optimizer: {choice: [adam, sgd]}"))  # two groups in one ask
    space = load_space(f)
    study = open_study(space, f"sqlite:///{tmp_path / 'st.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", main=IN_TEST)
    stats = sched.run(4)
    assert stats.counts["complete"] == 4 and sched.stack == 1
    said = [n for n in stats.notes if "not stacked" in n]
    assert len(said) == 1 and "Conv" in said[0], stats.notes  # once, however many groups
    assert not any("stack" in t.user_attrs["explore"] for t in study.trials)


@pytest.mark.parametrize("change,why", [
    ({"sampler": {"name": "random", "seed": 3}}, "a seeded run on one worker trains one "
                                                 "trial at a time"),
    ({"budget": {"in_flight": 8}}, "trials in rotation"),
    ({"objectives": [{"metric": "f1", "direction": "maximize"}]}, "an objective reads sums"),
])
def test_a_stack_the_run_cannot_use_is_said_with_why(tmp_path: Path, change: dict,
                                                     why: str) -> None:
    raw = {"name": "st", "dataset": "digits", "pruner": "none",
           "budget": {"trials": 4, "rounds": 1, "memory": "400MB", "workers": 1,
                      "stack": 4, **change.get("budget", {})},
           **{k: v for k, v in change.items() if k != "budget"}}
    space = parse_space(raw)
    study = open_study(space, f"sqlite:///{tmp_path / 'st.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1,
                      memory=space.budget.memory, device="cpu", main=IN_TEST)
    assert sched.stack == 1
    (note,) = [n for n in sched.stats.notes if "budget.stack" in n]
    assert note.startswith("budget.stack: 4 is not used: ") and why in note, note
    sched.close()


def test_a_stack_the_run_can_use_says_nothing(tmp_path: Path) -> None:
    space = parse_space({"name": "st", "dataset": "digits", "pruner": "none",
                         "budget": {"trials": 4, "rounds": 1, "memory": "400MB",
                                    "workers": 1, "stack": 4}})
    study = open_study(space, f"sqlite:///{tmp_path / 'st.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=1,
                      memory=space.budget.memory, device="cpu", main=IN_TEST)
    assert sched.stack == 4 and not sched.stats.notes
    sched.close()
