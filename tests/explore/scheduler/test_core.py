"""The scheduler's decisions, one at a time, on the core alone: events in, commands
out, no process, pipe, clock or storage (:mod:`explore.scheduler.core`)."""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

from engine.free_list import FreeList
from explore.scheduler.commands import (
    Admitted,
    Finished,
    Idle,
    Interrupted,
    Launch,
    Note,
    RegroupedStack,
    Reported,
    Send,
    Tell,
    WorkerDied,
)
from explore.scheduler.core import Core
from explore.scheduler.placement import Stack, Worker
from explore.scheduler.policy import PRUNE, Verdict
from explore.scheduler.protocol import Continue, Done, Pause, Regroup, Report, Stop
from explore.scheduler.simulated import SimCandidate, SimPolicy, SimProgram, SimTrial
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats

ARENA = 10_240


class Scripted(SimPolicy):
    """A pruner that says what the test says: ``verdicts[(trial, round)]``, and
    promotes the trials in ``promoted`` (the rest as the simulation's policy)."""

    def __init__(self, gated: bool = False, **verdicts: Verdict) -> None:
        super().__init__(0, gated)
        self.verdicts = {tuple(map(int, k[1:].split("_"))): v for k, v in verdicts.items()}
        self.promoted: set[int] = set()

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Verdict:
        self.steps[trial.number] = round
        return self.verdicts.get((trial.number, round))

    def promotable(self, trial: Any, rung: int) -> bool:
        return trial.number in self.promoted


def core_with(policy: Scripted, workers: int = 1, growth: int = 0) -> Core:
    stats = RunStats(ARENA * workers)
    stats.growth = growth
    core = Core(policy, stats, part=lambda st, members: SimProgram(1_000 * len(members)))
    for i in range(workers):
        core.add_worker(Worker(i, None, None, arena=ARENA,  # type: ignore[arg-type]
                               free=FreeList([(0, ARENA)])))
    return core


def admit(core: Core, *numbers: int, size: int = 2_048, requeued: bool = False) -> list[Any]:
    trials = [SimTrial(n) for n in numbers]
    pend = Pending(trials, SimCandidate((size,)), [requeued] * len(trials),
                   [None] * len(trials), [None] * len(trials))
    core.handle(Admitted(pend))
    return core.place()


def report(n: int, round: int) -> Report:
    return Report(n, round, {"score": 0.5}, 0.0)


def sent(commands: list[Any]) -> list[Any]:
    return [c.msg for c in commands if isinstance(c, Send)]


def ended(commands: list[Any]) -> dict[int, tuple[TrialState | None, bool]]:
    return {c.trial.number: (c.state, c.retry) for c in commands if isinstance(c, Tell)}


def test_the_least_busy_worker_takes_a_candidate() -> None:
    core = core_with(Scripted(), workers=2)
    first = [c for c in admit(core, 0) if isinstance(c, Launch)]
    second = [c for c in admit(core, 1) if isinstance(c, Launch)]
    assert [c.worker for c in first + second] == [0, 1]


def test_a_candidate_waits_for_room_and_takes_it_when_a_trial_ends() -> None:
    core = core_with(Scripted())
    admit(core, 0, size=8_000)
    assert not [c for c in admit(core, 1, size=4_000) if isinstance(c, Launch)]
    assert [t.number for p in core.waiting for t in p.trials] == [1]
    out = core.handle(Finished(0, Done(0, {"score": 0.9}, 3, 0, 0.0, 0.0, 1.0)))
    assert ended(out) == {0: (None, False)} and core.stats.best == 0.9
    launched = [c for c in core.place() if isinstance(c, Launch)]
    assert [c.pending.trials[0].number for c in launched] == [1] and not core.waiting


def test_a_model_that_could_not_be_written_leaves_its_trial_complete_and_says_why(
        ) -> None:
    core = core_with(Scripted())
    admit(core, 0)
    out = core.handle(Finished(0, Done(0, {"score": 0.7}, 3, 0, 0.0, 0.0, 1.0,
                                       model_error="its model could not be kept: full")))
    assert ended(out) == {0: (None, False)}
    tell = next(c for c in out if isinstance(c, Tell))
    assert not tell.saved
    note = next(c for c in out if isinstance(c, Note) and c.ending)
    assert note.values["model_error"] == "its model could not be kept: full"


def test_growth_beyond_the_constants_holds_a_candidate_back_or_fails_it() -> None:
    # the processes grew by more than the arena leaves beside the candidate: with
    # nothing placed it can never fit, and fails with the reason
    core = core_with(Scripted(), growth=ARENA - 1_024)
    out = admit(core, 0, size=2_048)
    assert ended(out) == {0: (TrialState.FAIL, False)}
    note = next(c for c in out if isinstance(c, Note))
    assert note.values["fail_reason"].startswith("does not fit: the run's processes grew by")


def test_a_pruned_trial_is_stopped_and_its_memory_given_back() -> None:
    core = core_with(Scripted(r0_1=PRUNE))
    admit(core, 0)
    out = core.handle(Reported(0, report(0, 1)))
    assert sent(out) == [Stop(0)] and ended(out) == {0: (TrialState.PRUNED, False)}
    assert core.heaps() == 0 and list(core.workers[0].free) == [(0, ARENA)]


def test_a_gated_trial_pauses_at_its_rung_and_resumes_when_promoted() -> None:
    policy = Scripted(gated=True, r0_1=1)
    core = core_with(policy)
    admit(core, 0)
    admit(core, 1)
    out = core.handle(Reported(0, report(0, 1)))
    assert sent(out) == [Pause(0)] and core.counts["paused"] == 1
    policy.promoted.add(0)
    out = core.handle(Reported(0, report(1, 1)))  # a result that promotes trial 0
    assert Continue(0) in sent(out)
    assert core.counts["paused"] == 0 and core.counts["resumed"] == 1


def test_when_only_paused_trials_are_held_one_makes_room_for_a_waiting_one() -> None:
    core = core_with(Scripted(gated=True, r0_1=1, r1_1=1))
    admit(core, 0, size=5_000)
    admit(core, 1, size=5_000)
    core.handle(Reported(0, report(0, 1)))
    core.handle(Reported(0, report(1, 1)))
    admit(core, 2, size=5_000)
    assert core.waiting and core.in_hand() == 0
    out = core.handle(Idle())  # the one paused longest gives way
    assert ended(out) == {0: (TrialState.PRUNED, False)}
    assert [c.pending.trials[0].number for c in core.place() if isinstance(c, Launch)] == [2]
    # nothing waits: every paused trial ends, the run is over
    assert ended(core.handle(Idle())) == {1: (TrialState.PRUNED, False)}


def test_a_dead_workers_trials_fail_and_are_queued_again_once() -> None:
    core = core_with(Scripted(), workers=2)
    admit(core, 0)
    admit(core, 1, requeued=True)  # a repeat already: it is not queued a third time
    admit(core, 2)
    out = core.handle(WorkerDied(0, -9, 1234))
    assert ended(out) == {0: (TrialState.FAIL, True), 2: (TrialState.FAIL, True)}
    reason = next(c for c in out if isinstance(c, Note)).values["fail_reason"]
    assert reason == "worker 0 (pid 1234) died with exit code -9"
    assert ended(core.handle(WorkerDied(1, -9, 1235))) == {1: (TrialState.FAIL, False)}
    assert 0 not in core.workers and 1 not in core.workers


def test_a_pruned_stack_member_has_the_others_regrouped_without_it() -> None:
    core = core_with(Scripted(r1_1=PRUNE))
    admit(core, 0, 1, 2, size=6_000)
    (st,) = core.workers[0].stacks.values()
    out = core.handle(Reported(0, report(1, 1)))
    assert sent(out) == [Stop(1)]
    out = core.place()  # the round's reports read: the stack regroups
    (regroup,) = sent(out)
    assert isinstance(regroup, Regroup) and regroup.number == st.number
    assert [p.members for p in regroup.parts] == [(0, 2)]
    assert st.regrouping and core.heaps() == 6_016 + 2_048  # the old region until copied
    core.handle(RegroupedStack(0, st.number))
    assert core.heaps() == 2_048 and core.counts["regrouped"] == 1


def test_a_paused_stack_member_waits_apart() -> None:
    core = core_with(Scripted(gated=True, r1_1=1))
    admit(core, 0, 1, size=4_000)
    core.handle(Reported(0, report(0, 1)))
    core.handle(Reported(0, report(1, 1)))
    (regroup,) = [m for m in sent(core.place()) if isinstance(m, Regroup)]
    assert [(p.members, p.paused) for p in regroup.parts] == [((0,), False), ((1,), True)]
    assert all(isinstance(st, Stack) for st in core.workers[0].stacks.values())


def test_ctrl_c_fails_and_queues_everything_in_hand_and_holds_nothing() -> None:
    core = core_with(Scripted())
    admit(core, 0, size=8_000)
    admit(core, 1, size=8_000)  # waits
    out = core.handle(Interrupted())
    assert ended(out) == {0: (TrialState.FAIL, True), 1: (TrialState.FAIL, True)}
    assert not core.holds() and list(core.workers[0].free) == [(0, ARENA)]


def test_lockstep_continues_one_trial_at_a_time_the_furthest_first() -> None:
    policy = Scripted()
    core = Core(policy, RunStats(ARENA), lockstep=True)
    core.add_worker(Worker(0, None, None, arena=ARENA,  # type: ignore[arg-type]
                           free=FreeList([(0, ARENA)])))
    admit(core, 0)
    assert core.in_flight == 0
    assert sent(core.handle(Reported(0, report(0, 1)))) == []  # no Continue yet
    assert sent(core.go()) == [Continue(0)] and sent(core.go()) == []  # one in flight
