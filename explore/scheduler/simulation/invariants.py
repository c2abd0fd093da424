"""What a simulated schedule must never break (the simulation's spec), checked against
the state a :class:`~explore.scheduler.simulation.Simulation` keeps: arena regions that
never overlap and account for every byte, heaps within the budget, states out within
their limit, every trial in exactly one place and told once, counts that match, and at
the end nothing held and every trial asked as often as it should be.

The checks that belong to one moment of the run (a launch beyond the room, a trial told
twice or pruned for lack of room, a simulated worker's region overwritten) are made
where that moment is played; each raises :class:`Violation` through :meth:`_where`.
"""

from __future__ import annotations

from optuna.trial import TrialState

from explore.scheduler.core import Core
from explore.scheduler.simulated import SimResident, SimWorker
from explore.scheduler.telemetry import RunStats


class Violation(AssertionError):
    """An invariant broken: the message names the seed that replays it."""


class Invariants:
    """The checks of :class:`~explore.scheduler.simulation.Simulation`, a part of it:
    the state they read is the simulation's (set in its ``__init__``)."""

    seed: int
    step: int
    core: Core
    stats: RunStats
    n_workers: int
    total: int
    rotation: int | None
    workers: dict[int, SimWorker]
    asked: int
    late_asks: list[int]
    repeats: set[int]
    told: dict[int, TrialState]
    retried: set[int]
    store: dict[int, SimResident]

    def _where(self, what: str) -> str:
        return f"seed {self.seed}, step {self.step}: {what} (replay: simulate({self.seed}))"

    def _turn_taken(self, worker: int, number: int) -> None:
        """Rotation: a worker runs one trial at a time, and the turn goes to the trial
        fewest rounds along (of those the core knows ready, and the candidates)."""
        if self.rotation is None:
            return
        sw = self.workers.get(worker)
        if sw is not None and any(r.runnable() for r in sw.residents.values()):
            raise Violation(self._where(f"trial {number} continued on worker {worker}, "
                                        "which runs another"))
        p = self.core.workers[worker].residents.get(number) if worker in self.core.workers \
            else None
        if p is None or self.n_workers > 1 or self.stats.growth or \
                self.core.switch_limit is not None:
            return  # several workers: a busy one's ready trial waits, others go on; the
            # processes grown, or the states out at their limit: a trial that cannot
            # fit now lets those that can go on
        behind = [q.rounds for q in self.core.ready] + [0] * len(self.core.waiting)
        if behind and min(behind) < p.rounds:
            raise Violation(self._where(f"trial {number} continued after round {p.rounds} "
                                        f"while another is ready after round {min(behind)}"))

    def check(self, final: bool = False) -> None:
        """Check every invariant of the state now (and, ``final``, those of a schedule
        played to its end): raises :class:`Violation` naming the seed and step."""
        core = self.core
        placed: dict[int, int] = {}
        paused = 0
        for w in core.workers.values():
            regions = [(o, n) for o, n in w.free]
            regions += [(p.offset, p.size) for p in w.residents.values() if p.size]
            regions += [(s.offset, s.size) for s in w.stacks.values()]
            regions.sort()
            end = 0
            for o, n in regions:
                if o < end:
                    raise Violation(self._where(f"worker {w.index}'s regions overlap at {o}"))
                end = o + n
            if sum(n for _, n in regions) != w.arena or end > w.arena:
                raise Violation(self._where(f"worker {w.index}'s arena is not all "
                                            f"accounted for: {regions} of {w.arena}"))
            for n, p in w.residents.items():
                if n in placed:
                    raise Violation(self._where(f"trial {n} held by two workers"))
                placed[n] = w.index
                paused += p.paused is not None
                if n in self.told:
                    raise Violation(self._where(f"trial {n} held after it ended"))
        if core.heaps() > self.stats.budget - self.stats.fixed:
            raise Violation(self._where("the placed heaps exceed the budget"))
        if core.switch_limit is not None and core.out_bytes() > core.switch_limit:
            raise Violation(self._where(f"{core.out_bytes():,} bytes of states out, "
                                        f"beyond the limit of {core.switch_limit:,}"))
        for n, p in core.out.items():
            paused += p.paused is not None
            if n not in self.store:
                raise Violation(self._where(f"trial {n} is out, but its state was never "
                                            "written"))
        for n in self.store:  # a state outlives its trial only where a worker died
            if n in self.told and self.told[n] != TrialState.FAIL:
                raise Violation(self._where(f"trial {n} ended {self.told[n].name}, its "
                                            "state left behind"))

        if core.counts["paused"] != paused:
            raise Violation(self._where(f"{core.counts['paused']} counted paused, "
                                        f"{paused} held paused"))
        waiting = [t.number for p in core.waiting + core.ahead for t in p.trials]
        told_counts = {s: 0 for s in ("complete", "pruned", "failed")}
        for s in self.told.values():
            told_counts[s.name.lower() if s != TrialState.FAIL else "failed"] += 1
        for k, v in told_counts.items():
            if core.counts[k] != v:
                raise Violation(self._where(f"counted {core.counts[k]} {k}, told {v}"))
        for n in range(self.asked):
            where = (n in placed) + (n in self.told) + waiting.count(n) + (n in core.out)
            if where != 1:
                raise Violation(self._where(f"trial {n} is in {where} places "
                                            "(held, ended, waiting or drawn ahead, "
                                            "switched out)"))
        if final:
            if core.holds():
                raise Violation(self._where("trials held at the end"))
            if len(self.told) != self.asked:
                raise Violation(self._where("a trial never ended"))
            if self.core.takes_new() and (self.asked - len(self.repeats) != self.total or
                                          len(self.repeats) != len(self.retried)):
                raise Violation(self._where("a re-queued trial was not asked again once"))
            # past the timeout the run ends short: what is left stays queued for the next
            if self.asked - len(self.repeats) > self.total or \
                    len(self.repeats) > len(self.retried):
                raise Violation(self._where("more trials asked than the total"))
            if self.late_asks:
                raise Violation(self._where(f"trials {self.late_asks} asked after the "
                                            "timeout"))
