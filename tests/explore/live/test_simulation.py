"""Several drivers on one study (:mod:`explore.live.simulation`): drivers that claim,
ask, report and end trials, die, stall, and meet a storage that fails, on a virtual
clock, every choice from one seed and every invariant checked after every step.
``pytest --simulate N`` scales the scheduler's simulation to N schedules (10,000 by
default); the study's plays N // 5 of them (2,000 by default, about 20 s on one core:
each runs real LiveStudy objects on Optuna's in-memory storage).  A failure names the
seed, and ``simulate(seed)`` replays it.

Each planted bug below is a mistake a change to :mod:`explore.live` could make; the
simulation must catch each within the first seeds, or it checks too little."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from optuna.trial import FrozenTrial

from explore.live import REQUEUED_FROM, Claim, LiveStudy
from explore.live.simulation import Violation, simulate
from explore.study import RECORD_ATTR

CHUNKS = 4  # the seeds in parts, so that pytest-xdist spreads them over the cores
SHARE = 5  # the study's schedules: --simulate's number divided by this


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_schedule_keeps_the_invariants(request: pytest.FixtureRequest,
                                             chunk: int) -> None:
    n = request.config.getoption("--simulate") // SHARE
    for seed in range(chunk * n // CHUNKS, (chunk + 1) * n // CHUNKS):
        simulate(seed)


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_the_schedules_reach_what_can_go_wrong() -> None:
    """Deaths, stalls, failed storage calls, stale trials found, re-queues, next runs,
    both samplers, every way a trial ends: the schedules exercise each, so the
    invariants are checked where they can break."""
    seen: Counter[str] = Counter()
    for seed in range(300):
        r = simulate(seed)
        seen[r.sampler] += 1
        seen.update(r.states)
        seen.update(r.stops)
        seen.update(r.conflicts)
        seen["died"] += r.died
        seen["next run"] += r.next_run
        seen["detected"] += len(r.detect)
        seen["several drivers"] += r.drivers > 1
        seen["heartbeats"] += sum(c.get("set_study_system_attr", 0) for c in r.calls.values())
    for what in ("random", "grid", "COMPLETE", "PRUNED", "FAIL", "storage failed",
                 "writes dropped", "died", "next run", "detected",
                 "several drivers", "heartbeats"):
        assert seen[what], (what, seen)


def test_a_seed_replays_the_same_schedule() -> None:
    for seed in (5, 123, 4_242):
        a, b = simulate(seed), simulate(seed)
        assert a == b and a.steps > 5


# -- planted bugs ------------------------------------------------------------------------
class ClaimsPastTheTotal(LiveStudy):
    """Claims, and keeps its claims, whatever the study's total."""

    def claim(self) -> Claim | None:
        total, self.total = self.total, 10**9
        try:
            return super().claim()
        finally:
            self.total = total

    def _lost(self, number: int, params: dict[str, Any]) -> str | None:
        total, self.total = self.total, 10**9
        try:
            return super()._lost(number, params)
        finally:
            self.total = total


class RequeuesARepeat(LiveStudy):
    """Fails a stale trial and re-queues it even when it is a repeat itself."""

    def _fail_stale(self, t: FrozenTrial, now: float) -> None:
        t = copy.copy(t)
        t.user_attrs = {k: v for k, v in t.user_attrs.items() if k != REQUEUED_FROM}
        if RECORD_ATTR in t.user_attrs:
            t.user_attrs[RECORD_ATTR] = {k: v for k, v in t.user_attrs[RECORD_ATTR].items()
                                         if k != REQUEUED_FROM}
        super()._fail_stale(t, now)


class EndsBesideQuietTrials(LiveStudy):
    """Ends once the trials that ended and run reach the total, not waiting for the
    trials of drivers gone quiet (which nobody may then re-run)."""

    def settled(self) -> bool:
        self.refresh(force=True)
        done, running = self.counts()
        return done + running >= self.total


@pytest.mark.parametrize(("bug", "what"), [
    (ClaimsPastTheTotal, "beyond the total"),
    (RequeuesARepeat, "itself a repeat"),
    (EndsBesideQuietTrials, "ended by itself with trial"),
])
def test_a_planted_bug_is_caught_and_replays(bug: type[LiveStudy], what: str) -> None:
    for seed in range(300):
        try:
            simulate(seed, bug)
        except Violation as e:
            assert what in str(e) and f"seed {seed}," in str(e)
            with pytest.raises(Violation) as again:
                simulate(seed, bug)
            assert str(again.value) == str(e)  # the same step, the same words
            simulate(seed)  # and the code as it is keeps the invariants there
            return
    pytest.fail(f"{bug.__name__} was not caught in 300 seeds")
