"""Candidates drawn ahead while the sampler draws blind, in the decision core alone: the
cheapest is released first, and those not begun fail and are queued again on Ctrl-C
(:meth:`explore.scheduler.core.Core.release`, :func:`explore.scheduler.core.placing.ahead`)."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.trial import TrialState

from explore.scheduler.commands import Interrupted, Launch, Note
from explore.scheduler.core import Core
from explore.scheduler.core.placing import AHEAD_PER_WORKER, ahead
from explore.scheduler.simulated import SimCandidate, SimTrial
from explore.scheduler.stacking import Pending
from tests.explore.scheduler.test_core import Scripted, core_with, ended


def drawn(number: int, flops: int, models: int = 1) -> Pending:
    """Trials ``number``.. as one candidate whose round takes ``flops`` per model."""
    trials = [SimTrial(number + i) for i in range(models)]
    return Pending(trials, SimCandidate((1_024,), round_flops=(flops, flops // 10)),
                   [False] * models, [None] * models, [None] * models)


def launched(core: Core) -> list[int]:
    return [c.pending.trials[0].number for c in core.place() if isinstance(c, Launch)]


def test_the_cheapest_drawn_ahead_is_released_first_the_earlier_of_equals() -> None:
    core = core_with(Scripted(), workers=2)
    core.ahead += [drawn(0, 900), drawn(1, 100), drawn(2, 500), drawn(3, 100)]
    order = []
    while core.release():
        order += launched(core)
    assert order == [1, 3, 2, 0] and not core.ahead and not core.waiting


def test_a_stack_costs_its_models_together() -> None:
    core = core_with(Scripted())
    core.ahead += [drawn(0, 300, models=4), drawn(4, 1_000)]
    assert core.release() and [t.number for t in core.waiting[0].trials] == [4]


def test_what_is_held_ahead_is_held_but_takes_no_room() -> None:
    core = core_with(Scripted())
    core.ahead.append(drawn(0, 100))
    assert core.holds() and core.in_hand() == 0 and core.heaps() == 0


def test_ctrl_c_fails_and_queues_what_was_drawn_ahead() -> None:
    core = core_with(Scripted())
    core.ahead += [drawn(0, 100), drawn(1, 200)]
    core.release()
    launched(core)
    out = core.handle(Interrupted())
    assert ended(out) == {0: (TrialState.FAIL, True), 1: (TrialState.FAIL, True)}
    assert not core.holds()
    # the one placed had started; the one still held ahead never did
    started = {c.trial.number: c.values["started"] for c in out
               if isinstance(c, Note) and "started" in c.values}
    assert started == {0: True, 1: False}


@pytest.mark.parametrize(("blind", "claimed", "workers", "unclaimed", "expected"), [
    (10, 0, 2, 60, 2 * AHEAD_PER_WORKER),  # at most a few per worker
    (10, 0, 1, 60, AHEAD_PER_WORKER),
    (10, 7, 2, 53, 3),  # the rest of the blind draws
    (10, 10, 2, 50, 1), (10, 40, 2, 20, 1), (0, 0, 2, 60, 1),  # none left: draw, start
    (None, 10_000, 3, 10_000, 3 * AHEAD_PER_WORKER),  # a random search: throughout
    (None, 90, 2, 5, 3), (10, 0, 2, 3, 2),  # the last trials shared among the workers
    (10, 0, 2, 0, 1),  # nothing left to claim: one ask finds it so
    (50, 0, 0, 60, AHEAD_PER_WORKER),  # before any worker is known
])
def test_how_many_are_drawn_ahead(blind: int | None, claimed: int, workers: int,
                                  unclaimed: int, expected: int) -> None:
    assert ahead(blind, claimed, workers, unclaimed) == expected


def test_each_sampler_says_how_many_trials_it_draws_blind() -> None:
    from explore.samplers import SamplerArgs, get
    args: Any = SamplerArgs(0, None, 1, {})
    assert get("tpe").blind(args) == 10 and get("cmaes").blind(args) == 1
    assert get("tpe").blind(SamplerArgs(0, 25, 1, {})) == 25
    assert get("random").blind(args) is None and get("grid").blind(args) is None
    assert get("nsga2").blind(args) == 50
