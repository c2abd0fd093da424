"""A schedule drawn from one seed and played to its end: :class:`Simulation` draws the
run's shape (workers, arenas, rounds, stack, pruner, the budget's knobs) and plays the
loop's part (ask, admit, carry out the core's commands) and, step by step, which thing
happens next in the world; its simulated workers are :mod:`.workers`', its checks
:mod:`.invariants`'.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

from engine.alignment import align_up
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
    RegroupedStack,
    Reported,
    Send,
    Tell,
    Tick,
    WorkerDied,
)
from explore.scheduler.core import Core
from explore.scheduler.core.placing import cost
from explore.scheduler.placement import Stack, Worker
from explore.scheduler.policy import PRUNE
from explore.scheduler.protocol import Continue, Done, Report, SwitchedOut
from explore.scheduler.simulated import (
    SimCandidate,
    SimPolicy,
    SimProgram,
    SimRegrouped,
    SimResident,
    SimStart,
    SimTrial,
    SimWorker,
)
from explore.scheduler.simulation.invariants import Violation
from explore.scheduler.simulation.workers import SimulatedWorkers
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats

MAX_STEPS = 20_000  # a schedule not over by then is stuck: nothing ends what it holds


@dataclass
class Result:
    """What a schedule came to: two plays of one seed give equal results."""

    seed: int
    trials: int  # trials asked (repeats of re-queued ones included)
    ended: int  # trials told
    steps: int
    states: dict[str, int]


class Simulation(SimulatedWorkers):
    """One schedule, drawn from ``seed``; :meth:`run` plays it to the end.

    ``core_type``: the decisions under test (a planted bug's subclass of :class:`Core`);
    ``knobs`` False draws none of the budget's knobs (rotation, switching, a limit on
    the states out, a timeout): the loop's defaults, as the drivers' simulation plays.
    """

    def __init__(self, seed: int, core_type: type[Core] = Core, knobs: bool = True) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        self.n_workers = rng.randint(1, 3)
        self.rounds = rng.randint(1, 4)
        self.total = rng.randint(2, 12)
        self.stack = rng.choice([1, 1, 2, 3])
        arena = align_up(rng.randint(2_000, 20_000))
        self.arena = arena
        self.stats = RunStats(0)
        self.stats.main, self.stats.data, self.stats.headroom = 1_000, 2_000, 500
        self.stats.overheads = [3_000] * self.n_workers
        self.stats.budget = self.stats.fixed + self.stats.headroom + arena * self.n_workers
        self.stats.arena = arena
        lockstep = self.n_workers == 1 and rng.random() < 0.3
        if lockstep:  # one trial at a time, as the loop runs a seeded run on one worker
            self.stack = 1
        self.policy = SimPolicy(seed, gated=rng.random() < 0.5)
        # drawn apart, so that the schedules drawn above stay those of their seeds
        # (``knobs`` False: none of them, the schedules the drivers' simulation replays)
        draw = random.Random(seed * 31 + 7)
        # rotation (the budget's in_flight): more trials in hand than the arenas hold
        self.rotation = draw.randint(1, 14) if knobs and not lockstep and \
            draw.random() < 0.3 else None
        if self.rotation is not None:
            self.stack = 1  # the loop does not stack trials in rotation
        self.switching = not knobs or self.rotation is not None or draw.random() < 0.9
        # the most bytes of states out at once
        limit = draw.choice([None, None, None, arena // 2, arena * 2]) if knobs else None
        # the budget's timeout, in the simulated clock (a step takes up to 1 s)
        self.timeout = draw.uniform(1.0, 60.0) if knobs and draw.random() < 0.2 else None
        # the sampler's blind draws (explore.scheduler.core.placing.ahead), and each
        # candidate's FLOPs, which order those drawn ahead: a stream of their own
        self.costs = random.Random(seed * 31 + 11)
        self.blind = self.costs.choice([0, 0, 3, 10, None]) if knobs else 0
        self.core = core_type(self.policy, self.stats, lockstep=lockstep, part=self._part,
                              switching=self.switching, rotation=self.rotation,
                              switch_limit=limit, timeout=self.timeout)
        self.gated = self.policy.gated or lockstep or self.rotation is not None
        self.workers: dict[int, SimWorker] = {}
        for i in range(self.n_workers):
            self._open(i)
        self.asked = 0
        self.want = 1  # trials the loop's last draw took: more than one, drawn ahead
        self.late_asks: list[int] = []  # asked past the timeout (none may be)
        self.queued: list[int] = []  # numbers whose repeat is to be asked first
        self.repeats: set[int] = set()  # numbers that are repeats
        self.told: dict[int, TrialState] = {}
        self.retried: set[int] = set()
        self.outbox: deque[tuple[int, Any]] = deque()  # (worker, message) to the core
        self.step = 0
        self.now = 0.0
        self.size_of: dict[int, int] = {}  # a trial's heap alone, for its parts
        self.store: dict[int, SimResident] = {}  # switched-out states: the files
        self.reported: dict[int, int] = {}  # each trial's last round run
        self.stacked: set[int] = set()  # trials drawn into a stack

    # -- the world --------------------------------------------------------------------
    def _open(self, index: int) -> None:
        """A worker with its arena open, in the core and in the world."""
        w = Worker(index, None, None, arena=self.arena,  # type: ignore[arg-type]
                   free=FreeList([(0, self.arena)]))
        self.core.add_worker(w)
        self.workers[index] = SimWorker(index)

    def _part(self, st: Stack, members: list[int]) -> SimProgram:
        return SimProgram(sum(self.size_of[m] for m in members) * 9 // 10 + 64)

    def _candidate(self) -> SimCandidate:
        big = self.rng.randint(200, max(300, self.arena * 6 // 5))  # some never fit
        return SimCandidate(tuple(sorted({big, big * 2 // 3, big // 3 + 1}, reverse=True)))

    def _ask(self) -> None:
        """The intake: claim (repeats first), sample, compile: one or a stack."""
        group: list[tuple[SimTrial, bool]] = []
        for _ in range(self.stack):
            if self.queued:
                self.queued.pop(0)
                requeued = True
            elif self.asked - len(self.repeats) < self.total:
                requeued = False
            else:
                break
            t = SimTrial(self.asked)
            if self.timeout is not None and self.now >= self.timeout:
                self.late_asks.append(t.number)
            self.asked += 1
            if requeued:
                self.repeats.add(t.number)
            group.append((t, requeued))
        self._admit(group)

    def _admit(self, group: list[tuple[Any, bool]]) -> None:
        """The intake's compile of a drawn ``group`` (trial, re-queued): a stack that
        fits an arena, or its trials alone; one that fits no arena fails unstarted."""
        if not group:
            return
        cand = self._candidate()
        flops = (self.costs.randint(1, 1_000), 0)
        size = cand.sizes[-1] * len(group) * 9 // 10 + 64
        # a stack compiled to fit an arena, or its trials run alone (the intake's rule)
        if len(group) > 1 and size <= self.arena and self.rng.random() < 0.7:
            for t, _ in group:
                self.size_of[t.number] = cand.sizes[-1]
                self.stacked.add(t.number)
            pend = Pending([t for t, _ in group], SimCandidate((size,), round_flops=flops),
                           [r for _, r in group], [None] * len(group), [None] * len(group))
            self._deliver(Admitted(pend, ahead=self.want > 1))
            return
        for t, r in group:
            if cand.sizes[-1] > self.arena:  # the intake's compile: does not fit
                self.core.fail(t, "does not fit", never_started=True)
                self._carry(self.core.take())
                continue
            self.size_of[t.number] = cand.sizes[0]
            alone = SimCandidate(cand.sizes, round_flops=(self.costs.randint(1, 1_000), 0))
            self._deliver(Admitted(Pending([t], alone, [r]), ahead=self.want > 1))

    def _deliver(self, event: Any) -> None:
        self._carry(self.core.handle(event))

    def _carry(self, commands: list[Any]) -> None:
        """The loop's part: carry out the core's commands (a dead worker found on the
        way is reported once they are done)."""
        dead: list[int] = []
        s = self.stats
        if any(isinstance(c, Launch) for c in commands) and \
                self.core.heaps() > s.budget - s.fixed - max(s.growth, s.headroom):
            raise Violation(self._where(f"placed {self.core.heaps():,} bytes of heaps, "
                                        "beyond the room the budget leaves"))
        for c in commands:
            if isinstance(c, Launch):
                self._turn_taken(c.worker, c.pending.trials[0].number)
                sw = self.workers.get(c.worker)
                if sw is None or not sw.alive:
                    self.core.unplace(c.worker, c.pending, c.stack, c.offset,
                                      align_up(c.program.total_bytes))
                    dead.append(c.worker)
                    continue
                members = [t.number for t in c.pending.trials]
                number = members[0] if c.stack is None else c.stack.number
                sw.inbox.append(SimStart(number, members, c.offset,  # type: ignore[arg-type]
                                         align_up(c.program.total_bytes)))
            elif isinstance(c, Send):
                if isinstance(c.msg, Continue):
                    self._turn_taken(c.worker, c.msg.number)
                sw = self.workers.get(c.worker)
                if sw is None or not sw.alive:
                    dead.append(c.worker)
                else:
                    sw.inbox.append(c.msg)
            elif isinstance(c, Tell):
                self._told(c)
            elif isinstance(c, DropState) and self.store.pop(c.number, None) is None:
                raise Violation(self._where(f"trial {c.number}'s state dropped, but it "
                                            "was never written"))
        for i in dict.fromkeys(dead):
            self._died(i)

    def _told(self, c: Tell) -> None:
        n = c.trial.number
        if n in self.told:
            raise Violation(self._where(f"trial {n} told twice"))
        state = TrialState.COMPLETE if c.state is None else c.state
        self.told[n] = state
        if state == TrialState.PRUNED and self.policy.said.get(n) != PRUNE and \
                self.switching and self.core.switch_limit is None and \
                (self.core.waiting or self.core.in_hand() >
                 sum(w.active() for w in self.core.workers.values())):
            # paused trials end pruned only when nothing could promote them any more
            raise Violation(self._where(f"trial {n} pruned for lack of room"))
        rung = self.policy.said.get(n)
        if state == TrialState.PRUNED and isinstance(rung, int) and n not in self.stacked \
                and self.policy.promotable(c.trial, rung):
            raise Violation(self._where(f"trial {n} pruned at rung {rung}, which promotes it"))
        if c.retry:
            if n in self.repeats and not self.interrupted:  # Ctrl-C queues every trial
                raise Violation(self._where(f"trial {n}, a repeat, queued again"))
            self.retried.add(n)
            self.queued.append(n)

    def _died(self, index: int) -> None:
        sw = self.workers.get(index)
        if sw is None or index not in self.core.workers:
            return
        sw.alive = False
        self.outbox = deque((i, m) for i, m in self.outbox if i != index)
        self._deliver(WorkerDied(index, -9, 1000 + index))
        self._open(index)  # a new worker takes its place

    # -- a step ------------------------------------------------------------------------
    def run(self) -> Result:
        """Play the schedule step by step to its end (or to its Ctrl-C), checking the
        invariants after every step: raises :class:`Violation` where one breaks."""
        interrupt_at = self.rng.randint(3, 80) if self.rng.random() < 0.1 else None
        self.interrupted = False
        while True:
            self.step += 1
            if self.step > MAX_STEPS:
                raise Violation(self._where("stuck: the run holds trials that nothing ends"))
            self.now += self.rng.random()
            self._deliver(Tick(self.now))
            if self.step == interrupt_at:
                self.interrupted = True
                self._deliver(Interrupted())
                self.check()
                if self.core.holds():
                    raise Violation(self._where("trials held after Ctrl-C"))
                break
            # the loop: ask while what was asked found room (or release what was drawn
            # ahead, the cheapest first), and place
            while self._asks() and (self.core.ahead or self._more()):
                if not self.core.ahead:
                    before = self.asked
                    self.want = self.core.draw_size(
                        self.blind, self.asked - len(self.repeats) - len(self.queued),
                        self.n_workers, self.total - self.asked + len(self.repeats))
                    while self._more() and self.asked - before < self.want:
                        self._ask()
                    if self.asked == before:
                        break
                self._release()
                self._carry(self.core.place())
            over = not self._more() or not self.core.takes_new()  # the total, or the timeout
            if not self.core.holds() and over and not self._busy():
                self.check()
                break
            if not self._busy() and self.core.idle():
                self._deliver(Idle())
            else:
                self._act()
            self._carry(self.core.go())
            self._carry(self.core.place())
            self.check()
        self.check(final=interrupt_at is None)
        states: dict[str, int] = {}
        for s in self.told.values():
            states[s.name] = states.get(s.name, 0) + 1
        return Result(self.seed, self.asked, len(self.told), self.step, states)

    def _release(self) -> None:
        """The loop's release of what was drawn ahead: the cheapest must go first."""
        least = min(map(cost, self.core.ahead), default=None)
        before = list(self.core.waiting)
        if not self.core.release():
            return
        (gone,) = [p for p in self.core.waiting if not any(p is b for b in before)]
        if cost(gone) != least or any(p is gone for p in self.core.ahead):
            raise Violation(self._where(f"trial {gone.trials[0].number} released from "
                                        f"those drawn ahead at a cost of {cost(gone)}, "
                                        f"where {least} was the least"))

    def _asks(self) -> bool:
        """The loop's rule for asking (:meth:`explore.scheduler.loop.Scheduler._asks`)."""
        if not self.core.takes_new():
            return False
        if self.rotation is not None:
            return self.core.in_rotation() < self.rotation
        return not self.core.waiting and self.core.in_hand() < len(self.core.workers)

    def _more(self) -> bool:
        return bool(self.queued) or self.asked - len(self.repeats) < self.total

    def _busy(self) -> bool:
        """Whether anything is on its way or can run in the world."""
        return bool(self.outbox) or any(
            sw.inbox or any(r.runnable() for r in sw.residents.values())
            for sw in self.workers.values() if sw.alive)

    def _act(self) -> None:
        """One thing happens: a message arrives at a worker or at the core, a worker
        runs a round, a worker dies, the processes grow or shrink."""
        choices: list[Any] = []
        for sw in self.workers.values():
            if not sw.alive:
                continue
            if sw.inbox:
                choices.append(("receive", sw))
            runnable = [r for r in sw.residents.values() if r.runnable()]
            # the worker's pick: a trial not yet begun waits while one part way can run
            runnable = [r for r in runnable if r.round > 0] or runnable
            if runnable:
                choices.append(("round", sw, runnable))
        if self.outbox:
            choices += [("report", None)] * 3
        if not choices:
            return
        roll = self.rng.random()
        if roll < 0.01:
            self._died(self.rng.choice(sorted(self.workers)))
            return
        if roll < 0.03:
            self.stats.growth = self.rng.choice([0, 0, 500, self.arena // 2])
            return
        choice = self.rng.choice(choices)
        if choice[0] == "receive":
            self._receive(choice[1])
        elif choice[0] == "round":
            self._run_round(choice[1], self.rng.choice(choice[2]))
        else:
            index, msg = self.outbox.popleft()
            if isinstance(msg, SimRegrouped):
                self._deliver(RegroupedStack(index, msg.number))
            elif isinstance(msg, SwitchedOut):
                self._deliver(LeftArena(index, msg))
            elif isinstance(msg, Report):
                self._deliver(Reported(index, msg))
            elif isinstance(msg, Done):
                self._deliver(Finished(index, msg))
            else:
                self._deliver(Failed(index, msg))


def simulate(seed: int, core_type: type[Core] = Core) -> Result:
    """Play the schedule of ``seed`` to its end, checking the invariants after every
    step; raises :class:`Violation` with the seed and step where one breaks."""
    return Simulation(seed, core_type).run()
