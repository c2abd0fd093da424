"""Whole runs, several drivers on one study (:mod:`explore.scheduler.drivers_simulation`):
each driver a decision core with its simulated workers and a real LiveStudy, on one
shared storage that is slow, fails calls and outlives drivers and workers lost at any
step; every choice from one seed, every invariant checked after every step.
``pytest --simulate N`` scales the scheduler's simulation to N schedules (10,000 by
default); this one plays N // 16 of them (625 by default, about 10 s of CPU: each
runs real LiveStudy objects on Optuna's in-memory storage).  A failure names the seed,
and ``simulate(seed)`` replays it.

Each planted bug below is a mistake a change to the core or to the study side could
make; the simulation must catch each within the first seeds, or it checks too little.
Two of them (a claim that does not wait for the claims before it, a repeat never
queued) the study's simulation alone does not catch: its claims never race, and it
lets a next run make up for a lost repeat."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from optuna.trial import TrialState

from explore.live import LiveStudy, counted
from explore.scheduler.core import Core
from explore.scheduler.drivers_simulation import REQUEUE_LOST, Violation, simulate
from explore.study import PARAMS_ATTR, RECORD_ATTR

CHUNKS = 4  # the seeds in parts, so that pytest-xdist spreads them over the cores
SHARE = 16  # this simulation's schedules: --simulate's number divided by this
SEARCH = 300  # the seeds a planted bug must be caught within


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_schedule_keeps_the_invariants(request: pytest.FixtureRequest,
                                             chunk: int) -> None:
    n = request.config.getoption("--simulate") // SHARE
    seeds = range(chunk * n // CHUNKS, (chunk + 1) * n // CHUNKS)
    seen: Counter[str] = Counter()
    for seed in seeds:
        r = simulate(seed)
        assert r.counted == r.total, r  # the study-wide total, exact
        seen[r.sampler] += 1
        seen["several drivers"] += r.drivers > 1
        seen["next run"] += r.next_run
        seen.update(r.states)
        seen.update(r.events)
        seen.update(r.gone)
    if len(seeds) >= 150:  # the schedules reach what can go wrong, where it can break
        for what in ("random", "grid", "several drivers", "next run", "COMPLETE", "PRUNED",
                     "FAIL", "paused", "resumed", "regrouped", "repeats", "worker died",
                     "stale found", "past the total", "surplus ended", "died", "interrupted",
                     "stopped: storage failed", "writes dropped", "drawn ahead"):
            assert seen[what], (what, seen)


def test_a_seed_replays_the_same_schedule() -> None:
    for seed in (7, 123, 4_242):
        a, b = simulate(seed), simulate(seed)
        assert a == b and a.steps > 10


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
@pytest.mark.parametrize("gap", [REQUEUE_LOST])
def test_a_known_gap_breaks_an_invariant_when_strict(gap: str) -> None:
    """The study side's known gaps are met, counted, and replay as violations with
    ``strict`` (they are let pass by default: see drivers_simulation's constants)."""
    for seed in range(SEARCH):
        if gap in simulate(seed, mishaps=4.0).gaps:
            with pytest.raises(Violation) as caught:
                simulate(seed, strict=True, mishaps=4.0)
            assert f"seed {seed}," in str(caught.value)
            return
    pytest.fail(f"{gap!r} not met in {SEARCH} seeds")


# -- planted bugs ------------------------------------------------------------------------
class ClaimsWithoutWaiting(LiveStudy):
    """Checks a claim against the claims before it without waiting for the parameters
    of those still being written: two drivers that claimed the study's last place at
    once both keep it."""

    def _lost(self, number: int, params: dict[str, Any]) -> str | None:
        self.refresh(force=True)
        before = [t for t in self.view if t.number < number]
        if sum(counted(t) or (t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs)
               for t in before) >= self.total:
            return "total"
        if self.unique and any(
                t.user_attrs.get(PARAMS_ATTR) == params and t.number != number
                and ((t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs)
                     or counted(t)) for t in self.view):
            return "duplicate"
        return None


class LosesTheRepeat(LiveStudy):
    """Fails a trial to be re-queued (its worker or driver died, Ctrl-C) but never
    queues its repeat: its parameters never run again."""

    def _requeue(self, params: dict[str, Any], number: int) -> None:
        pass


class ForgetsPausedWhenItsWorkerDies(Core):
    """Drops the paused trials of a dead worker instead of failing and re-queueing them
    (the study keeps them RUNNING for a driver that holds them nowhere)."""

    def _died(self, index: int, code: int | None, pid: int) -> None:
        w = self.workers.get(index)
        if w is not None:
            for n in [n for n, p in w.residents.items() if p.paused is not None]:
                del w.residents[n]
        super()._died(index, code, pid)


class PlacesBeyondTheRoom(Core):
    """Forgets that processes grown beyond their constants take room from the heaps."""

    def room(self) -> int:
        return self.stats.budget - self.stats.fixed


class ForgetsWhatWasDrawnAheadOnCtrlC(Core):
    """On Ctrl-C fails the trials in hand but not those drawn ahead, which the study
    keeps RUNNING for a driver that is gone."""

    def _interrupted(self) -> None:
        self.ahead = []
        super()._interrupted()


# Claims race only when a storage call is slow: more of them, and four drivers, for that.
RACING = {"slow": 0.5, "drivers": 4}


@pytest.mark.parametrize(("bug", "args", "what"), [
    ({"live_type": ClaimsWithoutWaiting}, RACING, "beyond the total"),
    ({"live_type": LosesTheRepeat}, {}, "failed to be re-queued"),
    ({"core_type": ForgetsPausedWhenItsWorkerDies}, {}, "in 0 places"),
    ({"core_type": PlacesBeyondTheRoom}, {}, "beyond the room"),
    # trials are held ahead only for a moment at the top of a loop: Ctrl-C more often
    ({"core_type": ForgetsWhatWasDrawnAheadOnCtrlC}, {"mishaps": 4.0}, "left RUNNING"),
], ids=["ClaimsWithoutWaiting", "LosesTheRepeat", "ForgetsPausedWhenItsWorkerDies",
        "PlacesBeyondTheRoom", "ForgetsWhatWasDrawnAheadOnCtrlC"])
def test_a_planted_bug_is_caught_and_replays(bug: dict[str, Any], args: dict[str, Any],
                                             what: str) -> None:
    for seed in range(SEARCH):
        try:
            simulate(seed, **bug, **args)
        except Violation as e:
            assert what in str(e) and f"seed {seed}," in str(e), str(e)
            with pytest.raises(Violation) as again:
                simulate(seed, **bug, **args)
            assert str(again.value) == str(e)  # the same step, the same words
            simulate(seed, **args)  # and the code as it is keeps the invariants there
            return
    pytest.fail(f"{bug} was not caught in {SEARCH} seeds")
