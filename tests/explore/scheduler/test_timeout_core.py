"""``budget.timeout`` in the decision core, with no process: no new trial is taken once
the time the loop ticks in has reached it, the trials in hand go on to their end, and
paused ones, which nothing running can promote any more, are pruned as at the end of
the trials budget (:meth:`explore.scheduler.core.Core.takes_new`)."""

from __future__ import annotations

from optuna.trial import TrialState

from explore.scheduler.commands import Finished, Idle, Reported, Tick
from explore.scheduler.protocol import Done, Pause
from tests.explore.scheduler.test_core import Scripted, admit, core_with, ended, report, sent


def test_no_new_trial_is_taken_from_the_timeout_on() -> None:
    core = core_with(Scripted())
    core.timeout = 30.0
    for now, takes in [(0.0, True), (29.99, True), (30.0, False), (31.0, False)]:
        core.handle(Tick(now))
        assert core.takes_new() is takes, now
    untimed = core_with(Scripted())
    untimed.handle(Tick(1e9))
    assert untimed.takes_new()


def test_after_the_timeout_the_trials_in_hand_end_and_the_paused_ones_are_pruned() -> None:
    policy = Scripted(gated=True, r0_1=1)  # trial 0 pauses at its rung
    core = core_with(policy, workers=2)
    core.timeout = 10.0
    admit(core, 0)
    admit(core, 1)
    out = core.handle(Reported(0, report(0, 1)))
    assert sent(out) == [Pause(0)] and core.counts["paused"] == 1
    core.handle(Tick(10.5))
    assert not core.takes_new() and core.holds()
    # trial 1, running when the time was up, goes on to its end
    core.handle(Reported(1, report(1, 1)))
    out = core.handle(Finished(1, Done(1, {"score": 0.9}, 3, 0, 0.0, 0.0, 10.8)))
    assert ended(out) == {1: (None, False)}
    # nothing runs and nothing new comes: no result can promote trial 0 any more
    assert core.idle()
    out = core.handle(Idle())
    assert ended(out) == {0: (TrialState.PRUNED, False)}
    assert not core.holds() and core.counts["pruned"] == 1 and core.heaps() == 0
