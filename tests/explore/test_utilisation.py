"""A run's utilisation (:mod:`explore.utilisation`): each trial's model FLOPs, counted
from its program, add up to the run's; a stack's are its members' together; the
workers' time is split by what it went to and the shares cover it; the summary says
how close the run came to the machine's peak."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from explore.binding import bind
from explore.candidate import compile_candidate
from explore.datasets import load_digits
from explore.scheduler import Scheduler
from explore.scheduler.protocol import SPENT
from explore.space import load_space
from explore.study import open_study
from explore.utilisation import PARTS, describe, of_run, round_flops, trial_rate
from tests.explore.cli_run import IN_TEST

SPACE = """\
name: ut
dataset: digits
budget: {{trials: {trials}, rounds: 3, memory: 400MB, workers: {workers}, stack: {stack}}}
sampler: random  # unseeded: a seeded run on one worker never stacks
pruner: none
model: {{depth: 1, width: 16, activation: relu}}
training: {{optimizer: adam, lr: {{float: [1.0e-3, 3.0e-2], log: true}}, batch_size: 32}}
"""


@pytest.fixture(autouse=True)
def known_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run reads the machine's peak, never measures it (within a budget, its operands
    would take room): here it is stated."""
    monkeypatch.setenv("EXPLORE_GEMM_PEAK", "1.5e11")


def run(tmp_path: Path, trials: int, workers: int, stack: int
        ) -> tuple[Any, optuna.Study, Any]:
    f = tmp_path / "ut.yaml"
    f.write_text(SPACE.format(trials=trials, workers=workers, stack=stack))
    space = load_space(f)
    study = open_study(space, f"sqlite:///{tmp_path / 'ut.db'}")
    bound = bind(space)
    stats = Scheduler(bound, study, load_digits(), workers=workers,
                      memory=space.budget.memory, device="cpu", main=IN_TEST).run(trials)
    return stats, study, bound


def test_the_trials_flops_are_their_programs_and_add_up_to_the_runs(tmp_path: Path) -> None:
    stats, study, bound = run(tmp_path, trials=4, workers=1, stack=4)
    records = [t.user_attrs["explore"] for t in study.trials]
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    assert stats.counts.get("stacked", 0) == 4  # one stack of all four: its FLOPs are shared
    # each member's are a quarter of the stack's: its own model's, compiled alone, but
    # for the metrics a stack leaves out (means only, explore.scheduler.stacking)
    data = load_digits()
    rows = (len(data.train.y), len(data.valid.y))
    for t, r in zip(study.trials, records, strict=True):
        alone = compile_candidate(bound, dict(r["params"]), 1 << 40)
        train, valid = round_flops(alone.program, alone.train_batch, rows)
        assert r["flops"] == pytest.approx(3 * (train + valid), rel=0.03), t.number
        # by hand, a digits MLP 64-16-10: the products forward are 2 * (64*16 + 16*10)
        # per row, backward the weights' gradients as many again and the hidden layer's
        # input gradient 2 * 16*10 (the data's is never needed); the rest (bias, relu,
        # the loss) adds less than half again, and Adam a few per weight per step
        products = 2 * (64 * 16 + 16 * 10)
        backward = products + 2 * 16 * 10
        assert products * rows[1] <= valid <= 1.5 * products * rows[1]
        weights = 64 * 16 + 16 + 16 * 10 + 10
        assert (products + backward) * rows[0] <= train <= \
            1.5 * (products + backward) * rows[0] + math.ceil(rows[0] / 32) * 20 * weights
        assert trial_rate(r) is not None and trial_rate(r) > 0
    work = stats.work()
    assert work["flops"]["train"] + work["flops"]["valid"] == sum(r["flops"] for r in records)
    # the worker's seconds, by what they went to: it trained and validated
    assert set(work["spent"]) == set(SPENT)
    assert work["spent"]["train"] > 0 and work["spent"]["valid"] > 0
    assert work["peak_flops"] and work["peak_flops"] > 0
    assert 0 < work["spent"]["train"] + work["spent"]["valid"] <= work["wall_s"] * work["workers"]
    # each trial's validation seconds are a part of its own
    assert all(0 < r["valid_seconds"] < r["busy_s"] for r in records)


def test_the_shares_cover_the_workers_time_and_the_summary_says_it(tmp_path: Path) -> None:
    stats, study, bound = run(tmp_path, trials=3, workers=2, stack=1)
    # trials alone: each one's FLOPs are exactly its program's, round by round
    data = load_digits()
    for t in study.trials:
        r = t.user_attrs["explore"]
        alone = compile_candidate(bound, dict(r["params"]), 1 << 40)
        train, valid = round_flops(alone.program, alone.train_batch,
                                   (len(data.train.y), len(data.valid.y)))
        assert r["flops"] == r["rounds"] * (train + valid) == 3 * (train + valid)
    u = of_run(stats.record_dict())
    assert u is not None and u.workers == 2
    assert sum(u.shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert set(u.shares) == set(PARTS) and u.shares["train"] > 0
    assert u.utilisation is not None and 0 < u.utilisation < 1
    assert u.total_flops == sum(t.user_attrs["explore"]["flops"] for t in study.trials)
    lines = describe(u)
    assert lines[0].startswith("utilisation: ") and "of the machine's peak" in lines[0]
    assert "training" in lines[1] and "of their peak" in lines[1]


def test_a_run_recorded_without_utilisation_has_none() -> None:
    assert of_run({"budget": 1}) is None
    assert of_run({"work": {"wall_s": 0.0, "workers": 2}}) is None
    assert trial_rate({"busy_s": 1.0}) is None
    # a stack's member: its share of the stack's time
    assert trial_rate({"flops": 100, "busy_s": 2.0, "stack": {"models": 4}}) == 200.0
