"""The scheduler's decisions, one at a time, on the core alone: events in, commands
out, no process, pipe, clock or storage (:mod:`explore.scheduler.core`)."""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

from engine.free_list import FreeList
from explore.scheduler.commands import (
    Admitted,
    DropState,
    Failed,
    Finished,
    Idle,
    Interrupted,
    Launch,
    LeftArena,
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
from explore.scheduler.protocol import (
    Continue,
    Done,
    Pause,
    Regroup,
    Report,
    Stop,
    SwitchedOut,
    SwitchIn,
    SwitchOut,
    TrialFailed,
)
from explore.scheduler.simulated import SimCandidate, SimPolicy, SimProgram, SimTrial
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats

ARENA = 10_240


class Scripted(SimPolicy):
    """A pruner that says what the test says: ``verdicts[(trial, round)]``, promotes
    the trials in ``promoted`` and ranks paused trials by ``standings`` (0: the best;
    the rest as the simulation's policy)."""

    def __init__(self, gated: bool = False, **verdicts: Verdict) -> None:
        super().__init__(0, gated)
        self.verdicts = {tuple(map(int, k[1:].split("_"))): v for k, v in verdicts.items()}
        self.promoted: set[int] = set()
        self.standings: dict[int, float] = {}

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Verdict:
        self.steps[trial.number] = round
        return self.verdicts.get((trial.number, round))

    def promotable(self, trial: Any, rung: int) -> bool:
        return trial.number in self.promoted

    def standing(self, trial: Any, rung: int) -> float:
        return self.standings.get(trial.number, 0.0)


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


def test_a_trial_whose_objective_is_not_finite_fails_with_the_reason() -> None:
    """A metric the validation rows cannot give (r2 of a constant target) is NaN:
    Optuna would fail the trial without a word; the core fails it saying why, its
    memory given back and its staged model discarded by the writer."""
    core = core_with(Scripted())
    admit(core, 0)
    out = core.handle(Finished(0, Done(0, {"score": float("nan"), "loss": 0.3}, 3, 0, 0.0,
                                       0.0, 1.0, saved=True)))
    assert ended(out) == {0: (TrialState.FAIL, False)}
    assert next(c for c in out if isinstance(c, Tell)).saved
    reason = next(c.values["fail_reason"] for c in out
                  if isinstance(c, Note) and "fail_reason" in c.values)
    assert "objective value is nan after round 3 (score nan not finite)" in reason
    assert core.counts["failed"] == 1 and core.counts["complete"] == 0
    assert core.stats.best is None and not core.workers[0].residents


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
    assert why_pruned(out) == {0: "by the pruner"}


def why_pruned(commands: list[Any]) -> dict[int, str]:
    """Each pruned trial's reason, as its record's note says."""
    return {c.trial.number: c.values["pruned"] for c in commands
            if isinstance(c, Note) and "pruned" in c.values}


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


def out_of(n: int, nbytes: int = 4_096) -> SwitchedOut:
    return SwitchedOut(n, nbytes, 0.01)


def paused_pair(policy: Scripted, workers: int = 1, size: int = 5_000) -> Core:
    """Trials 0 and 1 placed and paused at rung 1."""
    core = core_with(policy, workers=workers)
    admit(core, 0, size=size)
    admit(core, 1, size=size)
    core.handle(Reported(0, report(0, 1)))
    core.handle(Reported(0 if workers == 1 else 1, report(1, 1)))
    return core


def test_a_waiting_trial_has_the_lowest_standing_paused_one_switched_out_not_pruned(
        ) -> None:
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    policy.standings = {0: 0.2, 1: 0.8}  # trial 1 ranks lower at its rung: it leaves
    core = paused_pair(policy)
    out = admit(core, 2, size=5_000)
    assert sent(out) == [SwitchOut(1)] and not ended(out)
    # its region stays taken until the worker says the state is written
    assert core.heaps() == 10_112 and [t.number for p in core.waiting for t in p.trials] == [2]
    out = core.handle(LeftArena(0, out_of(1)))
    assert 1 in core.out and core.heaps() == 5_056 and core.counts["out"] == 1
    assert core.counts["paused"] == 2  # it is still paused, out of every arena
    launched = [c for c in core.place() if isinstance(c, Launch)]
    assert [(c.pending.trials[0].number, c.offset) for c in launched] == [(2, 5_056)]
    assert core.counts["pruned"] == 0


def test_the_switch_limit_lets_out_only_the_states_it_holds() -> None:
    """With ``switch_limit`` room for one state (a simulated program's state is its
    heap), the first waiting trial has one paused trial switched out; the second waits,
    and once nothing runs the paused trial left in is pruned for it, as without
    switching."""
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    policy.standings = {0: 0.2, 1: 0.8}
    core = paused_pair(policy)  # 5,056 bytes each: the arena holds two
    core.switch_limit = 6_000
    assert sent(admit(core, 2, size=5_000)) == [SwitchOut(1)]
    assert core.out_bytes() == 5_056  # on its way: counted as its program says
    core.handle(LeftArena(0, out_of(1, nbytes=4_000)))
    assert core.out_bytes() == 4_000  # written: as the worker says
    core.place()
    assert not sent(admit(core, 3, size=5_000))  # trial 0 would pass the limit: it stays
    core.handle(Finished(0, Done(2, {"score": 0.5}, 1, 0, 0.0, 0.0, 0.0)))
    out = core.handle(Idle())
    assert ended(out) == {0: (TrialState.PRUNED, False)} and why_pruned(out) == {0: "for room"}
    assert core.counts["out"] == 0 or 1 in core.out  # trial 1 waits out, unpruned


def test_only_the_trials_the_room_needs_leave_and_those_behind_wait_for_it() -> None:
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    core = paused_pair(policy, size=4_000)  # [0, 4032) and [4032, 8064): 2,176 free
    # trial 0 stands lowest, but its region is apart from the free end: trial 1's alone
    # makes a segment of 6,208, so trial 0 stays
    policy.standings = {0: 0.9, 1: 0.5}
    out = admit(core, 2, size=6_000)
    assert sent(out) == [SwitchOut(1)]
    out = admit(core, 3, size=1_000)  # it would fit the gap, but waits behind trial 2
    assert not sent(out) and not [c for c in out if isinstance(c, Launch)]
    core.handle(LeftArena(0, out_of(1)))
    launched = [c for c in core.place() if isinstance(c, Launch)]
    assert [(c.pending.trials[0].number, c.offset) for c in launched] == [(2, 4_032)]
    assert [t.number for p in core.waiting for t in p.trials] == [3]


def test_a_promoted_trial_comes_back_into_any_arena_with_room() -> None:
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    core = paused_pair(policy, workers=2, size=8_000)
    assert sent(admit(core, 2, size=8_000)) == [SwitchOut(0)]  # worker 0: the first
    core.handle(LeftArena(0, out_of(0)))
    assert [c.worker for c in core.place() if isinstance(c, Launch)] == [0]
    policy.promoted.add(0)
    core.handle(Reported(0, report(2, 1)))  # a result that promotes trial 0, out
    assert core.counts["resumed"] == 1 and core.in_hand() == 2  # trial 2 and it
    # no arena has room: trial 1, paused in worker 1, leaves for it
    assert sent(core.place()) == [SwitchOut(1)]
    core.handle(LeftArena(1, out_of(1)))
    msgs = [(c.worker, c.msg) for c in core.place() if isinstance(c, Send)]
    assert [type(m) for _, m in msgs] == [SwitchIn, Continue]
    assert msgs[0] == (1, SwitchIn(0, msgs[0][1].program, 0)) and msgs[1][1] == Continue(0)
    assert msgs[0][1].program.total_bytes == 8_000 and 0 in core.workers[1].residents
    assert core.counts["switched_in"] == 1 and list(core.out) == [1]


def test_new_candidates_wait_behind_a_promoted_trial_that_waits_for_room() -> None:
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    core = paused_pair(policy, size=5_000)
    admit(core, 2, size=5_000)
    core.handle(LeftArena(0, out_of(0)))
    core.place()
    policy.promoted.add(0)
    core.handle(Reported(0, report(2, 1)))  # trial 2 goes on; 0 is promoted
    out = admit(core, 3, size=1_000)  # it would fit, but the promoted trial goes first
    assert sent(out) == [SwitchOut(1)] and not [c for c in out if isinstance(c, Launch)]


def test_paused_trials_are_pruned_at_the_end_switched_out_ones_without_a_worker() -> None:
    core = paused_pair(Scripted(gated=True, r0_1=1, r1_1=1))
    admit(core, 2, size=5_000)
    core.handle(LeftArena(0, out_of(0, nbytes=4_000)))
    core.place()
    core.handle(Finished(0, Done(2, {"score": 0.9}, 3, 0, 0.0, 0.0, 1.0)))
    assert core.idle()
    out = core.handle(Idle())  # nothing waits: no result can promote them any more
    assert ended(out) == {0: (TrialState.PRUNED, False), 1: (TrialState.PRUNED, False)}
    assert why_pruned(out) == {0: "paused, not promoted", 1: "paused, not promoted"}
    assert sent(out) == [Stop(1)] and DropState(0) in out
    note = next(c for c in out if isinstance(c, Note) and c.trial.number == 0)
    assert note.values["switched_out"] == 1 and note.values["switch_bytes"] == 4_000
    assert not core.holds() and core.counts["pruned"] == 2


def test_a_trial_promoted_on_its_way_out_comes_back_once_out() -> None:
    policy = Scripted(gated=True, r0_1=1, r1_1=1)
    core = paused_pair(policy, size=5_000)
    admit(core, 2, size=5_000)  # trial 0 leaves for it
    policy.promoted.add(0)
    out = core.handle(Reported(0, report(1, 1)))  # promoted while its state is written
    assert Continue(0) not in sent(out)
    core.handle(LeftArena(0, out_of(0)))
    msgs = sent(core.place())
    assert msgs[:2] == [SwitchIn(0, msgs[0].program, 0), Continue(0)]


def test_a_state_that_cannot_be_written_fails_its_trial_and_frees_its_region() -> None:
    core = paused_pair(Scripted(gated=True, r0_1=1, r1_1=1))
    admit(core, 2, size=5_000)
    out = core.handle(Failed(0, TrialFailed(0, "could not be switched out: disk full")))
    assert ended(out) == {0: (TrialState.FAIL, False)}
    assert [c.pending.trials[0].number for c in core.place() if isinstance(c, Launch)] == [2]


def test_ctrl_c_fails_switched_out_trials_and_drops_their_files() -> None:
    core = paused_pair(Scripted(gated=True, r0_1=1, r1_1=1))
    admit(core, 2, size=5_000)
    core.handle(LeftArena(0, out_of(0)))
    out = core.handle(Interrupted())
    assert ended(out) == {n: (TrialState.FAIL, True) for n in (0, 1, 2)}
    assert DropState(0) in out and not core.holds() and not core.out


def test_a_dead_workers_switched_out_trials_live_on() -> None:
    core = paused_pair(Scripted(gated=True, r0_1=1, r1_1=1))
    admit(core, 2, size=5_000)
    core.handle(LeftArena(0, out_of(0)))
    core.place()
    out = core.handle(WorkerDied(0, -9, 1234))
    assert set(ended(out)) == {1, 2} and list(core.out) == [0]


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


def test_a_paused_stack_member_without_room_apart_leaves_alone_not_pruned() -> None:
    """No room beside the stack for the paused member's own program: it is switched out
    as that program (compiled apart, as a regroup would), and the others go on."""
    core = core_with(Scripted(gated=True, r1_1=1))
    admit(core, 0, 1, 2, size=9_000)
    (st,) = core.workers[0].stacks.values()
    went = [m for n in (0, 1, 2) for m in sent(core.handle(Reported(0, report(n, 1))))]
    assert went == [Continue(0), Pause(1), Continue(2)]  # 0 and 2 go on
    msgs = sent(core.place())
    (switch,) = [m for m in msgs if isinstance(m, SwitchOut)]
    assert switch.number == 1 and switch.program.total_bytes == 1_000
    core.handle(LeftArena(0, out_of(1, nbytes=900)))
    assert 1 in core.out and core.out[1].stack is None and core.out[1].size == 1_024
    assert st.held == {0, 2} and core.counts["pruned"] == 0
    core.handle(Finished(0, Done(0, {"score": 0.5}, 2, 0, 0.0, 0.0, 0.0)))
    core.handle(Finished(0, Done(2, {"score": 0.5}, 2, 0, 0.0, 0.0, 0.0)))
    assert core.heaps() == 0  # the stack's region is free once its members ended


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


def test_lockstep_a_switched_out_trial_goes_on_in_its_turn_as_if_it_had_stayed() -> None:
    """The trial whose turn it is goes on whether it stayed in the arena or not: a
    seeded run is the same at any budget.  Trial 0, promoted while out, is picked
    before trial 1 (as the furthest along, then the oldest): trial 1, waiting for its
    turn, leaves for it."""
    policy = Scripted(r0_1=1)
    policy.gated = True
    core = Core(policy, RunStats(ARENA), lockstep=True)
    core.add_worker(Worker(0, None, None, arena=ARENA,  # type: ignore[arg-type]
                           free=FreeList([(0, ARENA)])))
    admit(core, 0, size=6_000)
    assert sent(core.handle(Reported(0, report(0, 1)))) == [Pause(0)]
    assert sent(admit(core, 1, size=6_000)) == [SwitchOut(0)]
    core.handle(LeftArena(0, out_of(0)))
    assert [c.pending.trials[0].number for c in core.place() if isinstance(c, Launch)] == [1]
    policy.promoted.add(0)
    core.handle(Reported(0, report(1, 1)))  # 1 goes on, 0 is promoted: both ready
    assert sent(core.go()) == [SwitchOut(1)] and core.in_flight is None
    core.handle(LeftArena(0, out_of(1)))
    msgs = sent(core.go())
    assert msgs == [SwitchIn(0, msgs[0].program, 0), Continue(0)] and core.in_flight == 0
