"""The decision core against thousands of simulated schedules
(:mod:`explore.scheduler.simulation`): workers that run, report, fail and die, messages
that cross, processes that grow, Ctrl-C; every choice from one seed, every invariant
checked after every step.  ``pytest --simulate N`` plays N schedules (10,000 by
default); a failure names the seed, and ``simulate(seed)`` replays it.

Each planted bug below is a one-line mistake a change to the core could make; the
simulation must catch each within the first seeds, or it checks too little."""

from __future__ import annotations

import pytest

from explore.scheduler.core import Core
from explore.scheduler.placement import Placement, Worker
from explore.scheduler.simulation import Simulation, Violation, simulate

CHUNKS = 8  # the seeds in parts, so that pytest-xdist spreads them over the cores


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_schedule_keeps_the_invariants(request: pytest.FixtureRequest,
                                             chunk: int) -> None:
    n = request.config.getoption("--simulate")
    seeds = range(chunk * n // CHUNKS, (chunk + 1) * n // CHUNKS)
    states: dict[str, int] = {}
    for seed in seeds:
        for k, v in simulate(seed).states.items():
            states[k] = states.get(k, 0) + v
    if len(seeds) >= 200:  # the schedules reach every way a trial ends
        assert {"COMPLETE", "PRUNED", "FAIL"} <= set(states), states


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_the_schedules_reach_what_the_core_decides() -> None:
    """Pauses resumed, stacks regrouped, trials switched out and back in, workers dead,
    repeats asked, Ctrl-C: the schedules exercise each, so the invariants are checked
    where they can break."""
    seen = dict.fromkeys(("resumed", "regrouped", "switched_out", "switched_in", "repeats",
                          "interrupted"), 0)
    for seed in range(600):
        sim = Simulation(seed)
        sim.run()
        for k in ("resumed", "regrouped", "switched_out", "switched_in"):
            seen[k] += sim.core.counts.get(k, 0)
        seen["repeats"] += len(sim.repeats)
        seen["interrupted"] += sim.interrupted
    assert all(seen.values()), seen


def test_a_seed_replays_the_same_schedule() -> None:
    a, b = simulate(123), simulate(123)
    assert a == b and a.steps > 10


# -- planted bugs ------------------------------------------------------------------------
class PlacesBeyondTheRoom(Core):
    """Forgets that processes grown beyond their constants take room from the heaps."""

    def room(self) -> int:
        return self.stats.budget - self.stats.fixed


class KeepsPausedTrialsWhenIdle(Core):
    """Never prunes a paused trial when nothing could promote it."""

    def _idle(self) -> None:
        pass


class LeaksARegroupedStack(Core):
    """Drops a regrouped stack without giving its region back."""

    def _regrouped(self, w: Worker | None, number: int) -> None:
        if w is not None:
            w.stacks.pop(number, None)


class QueuesRepeatsAgain(Core):
    """Queues every trial of a dead worker again, repeats included: a trial that
    kills its worker would be run forever."""

    def _died(self, index: int, code: int | None, pid: int) -> None:
        w = self.workers.pop(index, None)
        if w is None:
            return
        self.in_flight = None
        for p in list(w.residents.values()):
            self.fail(p.trial, "died", retry=True)


class ForgetsPausedOnResume(Core):
    """Resumes a paused trial without taking it off the pause (it is promoted again
    and again, and never waits apart from its stack)."""

    def _resume_promoted(self) -> None:
        for w, p in self.paused():
            assert p.paused is not None
            if w is not None and self.policy.promotable(p.trial, p.paused):
                self._continue(w, p)


class PrunesForRoom(Core):
    """Prunes the paused trial longest waiting when another needs its room, as the
    core did before trials could be switched out."""

    def _make_room(self, size: int, among: dict[int, Worker] | None = None) -> bool:
        return False

    def _make_way(self) -> None:
        for w, p in self.paused():
            if w is not None:
                self._prune(w, p, "for room")
                return


class FreesBeforeTheStateIsWritten(Core):
    """Frees a leaving trial's region when it sends the SwitchOut, not when the worker
    says the state is written: a Start there could overwrite it first."""

    def _switch_out(self, w: Worker, p: Placement) -> None:
        super()._switch_out(w, p)
        del w.residents[p.trial.number]
        w.free.release(p.offset, p.size)
        p.leaving = False
        self.out[p.trial.number] = p


class SwitchesOutARunningTrial(Core):
    """Takes any trial alone for one that may leave, running ones too."""

    def _idle_on(self, w: Worker) -> list[Placement]:
        return [p for p in w.residents.values()
                if not p.leaving and p.stack is None and p.program is not None]


class ForgetsAPromotedTrialOut(Core):
    """Promotes only the paused trials still in an arena: one switched out stays paused
    out, and is pruned at the end though its rung promotes it."""

    def paused(self) -> list[tuple[Worker | None, Placement]]:
        return [(w, p) for w, p in super().paused() if w is not None] \
            if self._promoting else super().paused()

    _promoting = False

    def _resume_promoted(self) -> None:
        self._promoting = True
        try:
            super()._resume_promoted()
        finally:
            self._promoting = False


class TakesTurnsFurthestFirst(Core):
    """Rotation: gives the turn to the trial furthest along (as lockstep does), so a
    trial runs ahead while others wait behind."""

    def _rotate(self) -> None:
        for p in self.ready:
            p.rounds = -p.rounds
        try:
            super()._rotate()
        finally:
            for p in self.ready + [q for w in self.workers.values()
                                   for q in w.residents.values()] + list(self.out.values()):
                p.rounds = abs(p.rounds)


class GivesABusyWorkerATurn(Core):
    """Rotation: forgets which worker runs what, giving a worker a second trial to run
    while it runs one."""

    def _rotate(self) -> None:
        self.running.clear()
        super()._rotate()


class IgnoresTheTimeout(Core):
    """Takes new trials past the budget's timeout (Optuna's ``optimize(timeout=)``)."""

    def takes_new(self) -> bool:
        return True


class ReleasesInTheOrderDrawn(Core):
    """Releases what was drawn ahead in the order it was drawn, not the cheapest
    first."""

    def release(self) -> bool:
        if not self.ahead:
            return False
        self.waiting.append(self.ahead.pop(0))
        return True


@pytest.mark.parametrize("planted", [PlacesBeyondTheRoom, KeepsPausedTrialsWhenIdle,
                                     LeaksARegroupedStack, QueuesRepeatsAgain,
                                     ForgetsPausedOnResume, PrunesForRoom,
                                     FreesBeforeTheStateIsWritten, SwitchesOutARunningTrial,
                                     ForgetsAPromotedTrialOut, TakesTurnsFurthestFirst,
                                     GivesABusyWorkerATurn, IgnoresTheTimeout,
                                     ReleasesInTheOrderDrawn])
def test_a_planted_bug_is_caught_and_its_seed_replays_it(planted: type[Core]) -> None:
    caught: tuple[int, str] | None = None
    for seed in range(3_000):
        try:
            simulate(seed, planted)
        except (Violation, AssertionError, KeyError) as e:
            caught = (seed, str(e))
            break
    assert caught is not None, f"{planted.__name__} went unseen in 3,000 schedules"
    seed, message = caught
    with pytest.raises((Violation, AssertionError, KeyError)) as again:
        simulate(seed, planted)
    assert str(again.value) == message
    simulate(seed)  # the same schedule keeps every invariant without the bug
