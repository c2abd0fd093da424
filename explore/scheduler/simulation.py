"""A deterministic simulation of one driver's run: the decision core (:mod:`.core`)
against simulated workers, messages that cross, workers that die, processes that grow,
and Ctrl-C, every choice drawn from one seed.

A schedule is what one seed makes of a run: how many workers and what arenas, which
candidates (alone or stacked, each with several programs to fall back on), what the
pruner says of each report, and, step by step, which message is delivered next, which
worker runs a round, which dies, which switched-out state cannot be written.  A
simulated worker keeps each resident's region of its arena, and a switched-out
trial's state in a simulated file, so what the core decides is checked against what
the workers would hold: no region overwritten, no state read that was not written,
no round lost or run twice across switches, nothing pruned for lack of room.

After every step the invariants are checked; a failing seed raises
:class:`Violation` naming the seed and the step, and ``simulate(seed)`` replays the
same schedule exactly (nothing here reads a clock or the system's randomness).
``tests/explore/scheduler/test_simulation.py`` runs thousands of seeds.

>>> result = simulate(7)
>>> result.ended == result.trials and result.steps > 0
True
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
from explore.scheduler.placement import Stack, Worker
from explore.scheduler.policy import PRUNE
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
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats

MAX_STEPS = 20_000  # a schedule not over by then is stuck: nothing ends what it holds


class Violation(AssertionError):
    """An invariant broken: the message names the seed that replays it."""


@dataclass
class Result:
    seed: int
    trials: int  # trials asked (repeats of re-queued ones included)
    ended: int  # trials told
    steps: int
    states: dict[str, int]


class Simulation:
    """One schedule, drawn from ``seed``; :meth:`run` plays it to the end."""

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
        self.core = core_type(self.policy, self.stats, lockstep=lockstep, part=self._part,
                              switching=self.switching, rotation=self.rotation,
                              switch_limit=limit, timeout=self.timeout)
        self.gated = self.policy.gated or lockstep or self.rotation is not None
        self.workers: dict[int, SimWorker] = {}
        for i in range(self.n_workers):
            self._open(i)
        self.asked = 0
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
        size = cand.sizes[-1] * len(group) * 9 // 10 + 64
        # a stack compiled to fit an arena, or its trials run alone (the intake's rule)
        if len(group) > 1 and size <= self.arena and self.rng.random() < 0.7:
            for t, _ in group:
                self.size_of[t.number] = cand.sizes[-1]
                self.stacked.add(t.number)
            pend = Pending([t for t, _ in group], SimCandidate((size,)),
                           [r for _, r in group], [None] * len(group), [None] * len(group))
            self._deliver(Admitted(pend))
            return
        for t, r in group:
            if cand.sizes[-1] > self.arena:  # the intake's compile: does not fit
                self.core.fail(t, "does not fit", never_started=True)
                self._carry(self.core.take())
                continue
            self.size_of[t.number] = cand.sizes[0]
            self._deliver(Admitted(Pending([t], cand, [r])))

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

    # -- a simulated worker ------------------------------------------------------------
    def _receive(self, sw: SimWorker) -> None:
        msg = sw.inbox.popleft()
        if isinstance(msg, SimStart):
            self._region_free(sw, msg.offset, msg.size, f"trial {msg.number}'s start")
            r = SimResident(msg.number, list(msg.members), self.rounds, self.gated,
                            live=set(msg.members), region=(msg.offset, msg.size))
            sw.residents[msg.number] = r
            for m in msg.members:
                sw.owner[m] = msg.number
        elif isinstance(msg, Continue | Pause):
            if msg.number in sw.owner:
                sw.residents[sw.owner[msg.number]].word(msg.number, isinstance(msg, Continue))
        elif isinstance(msg, Stop):
            if msg.number in sw.owner:
                r = sw.residents[sw.owner[msg.number]]
                r.word(msg.number, None)
                if not r.live:
                    self._drop(sw, r.number)
        elif isinstance(msg, Regroup):
            old = sw.residents.get(msg.number)
            if old is not None:
                for part in msg.parts:
                    size = align_up(part.program.total_bytes)
                    self._region_free(sw, part.offset, size, f"part {part.number}")
                    r = SimResident(part.number, list(part.members), old.rounds, old.gated,
                                    old.round, set(part.members) & old.live,
                                    old.waiting & set(part.members),
                                    set(part.members) if part.paused else set(),
                                    (part.offset, size))
                    sw.residents[part.number] = r
                for m in old.members:
                    sw.owner.pop(m, None)
                for part in msg.parts:
                    for m in part.members:
                        sw.owner[m] = part.number
                sw.residents.pop(msg.number)
            self.outbox.append((sw.index, SimRegrouped(msg.number)))
        elif isinstance(msg, SwitchOut):
            self._switch_out(sw, msg)
        elif isinstance(msg, SwitchIn):
            self._switch_in(sw, msg)

    def _switch_out(self, sw: SimWorker, msg: SwitchOut) -> None:
        """Write the trial's state to its simulated file and give its region back (or
        fail to write it, as a full disk would)."""
        n = msg.number
        r = sw.residents.get(sw.owner.get(n, n))
        if r is None or n not in r.live:
            raise Violation(self._where(f"trial {n} switched out, but worker {sw.index} "
                                        "does not hold it"))
        if r.members != [n]:  # a stack's member leaves alone: masked there, as stopped
            if n not in r.held:
                raise Violation(self._where(f"stacked trial {n} switched out while it "
                                            "could run"))
            r.word(n, None)
            sw.owner.pop(n, None)
            if not r.live:
                self._drop(sw, r.number)
            r = SimResident(n, [n], r.rounds, r.gated, r.round, {n},
                            region=(0, align_up(msg.program.total_bytes)))
        elif r.runnable():
            raise Violation(self._where(f"trial {n} switched out while it could run"))
        else:
            self._drop(sw, n)
        if self.rng.random() < 0.03:
            self.outbox.append((sw.index, TrialFailed(n, "could not be switched out: "
                                                         "simulated")))
            return
        self.store[n] = r
        self.outbox.append((sw.index, SwitchedOut(n, r.region[1], 0.0)))

    def _switch_in(self, sw: SimWorker, msg: SwitchIn) -> None:
        """Read the trial's state back into its new region: it waits for its word."""
        r = self.store.pop(msg.number, None)
        if r is None:
            raise Violation(self._where(f"trial {msg.number} switched in, but its state "
                                        "was never written"))
        size = align_up(msg.program.total_bytes)
        self._region_free(sw, msg.offset, size, f"trial {msg.number}'s switch in")
        r.region, r.waiting, r.held = (msg.offset, size), {msg.number}, set()
        sw.residents[msg.number] = r
        sw.owner[msg.number] = msg.number

    def _region_free(self, sw: SimWorker, offset: int, size: int, what: str) -> None:
        held = sw.overlaps(offset, size)
        if held is not None:
            raise Violation(self._where(f"{what} at [{offset}, {offset + size}) of worker "
                                        f"{sw.index} overwrites {held}, still there"))

    def _drop(self, sw: SimWorker, number: int) -> None:
        r = sw.residents.pop(number, None)
        if r is not None:
            for m in r.members:
                if sw.owner.get(m) == number:
                    del sw.owner[m]

    def _run_round(self, sw: SimWorker, r: SimResident) -> None:
        live = sorted(r.live)
        for m in live:  # the core's view: what runs is not paused
            p = self.core.workers[sw.index].residents.get(m)
            if p is not None and p.paused is not None:
                raise Violation(self._where(f"trial {m} runs while paused at rung "
                                            f"{p.paused}"))
        r.round += 1
        for m in live:  # a switch (or a regroup) loses no round and repeats none
            if self.reported.get(m, 0) + 1 != r.round:
                raise Violation(self._where(f"trial {m} ran round {r.round} after round "
                                            f"{self.reported.get(m, 0)}"))
            self.reported[m] = r.round
        if self.rng.random() < 0.03:  # a trial's loss diverges, or its code raises
            m = self.rng.choice(live)
            self.outbox.append((sw.index, TrialFailed(m, "diverged: simulated")))
            r.word(m, None)
            live.remove(m)
        if r.round >= r.rounds or not live:
            self._drop(sw, r.number)
            for m in live:
                self.outbox.append((sw.index, Done(m, {"score": self._score(m)}, r.round,
                                                   0, 0.0, self.now, self.now)))
            return
        if r.gated:
            r.waiting = set(live)
        for m in live:
            self.outbox.append((sw.index, Report(m, r.round, {"score": self._score(m)},
                                                 self.now)))

    def _score(self, number: int) -> float:
        return random.Random(self.seed * 7_919 + number).random()

    # -- a step ------------------------------------------------------------------------
    def run(self) -> Result:
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
            # the loop: ask while what was asked found room, and place
            while self._more() and self._asks():
                before = self.asked
                self._ask()
                self._carry(self.core.place())
                if self.asked == before:
                    break
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

    # -- the invariants ----------------------------------------------------------------
    def _where(self, what: str) -> str:
        return f"seed {self.seed}, step {self.step}: {what} (replay: simulate({self.seed}))"

    def check(self, final: bool = False) -> None:
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
        waiting = [t.number for p in core.waiting for t in p.trials]
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
                                            "(held, ended, waiting, switched out)"))
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


def simulate(seed: int, core_type: type[Core] = Core) -> Result:
    """Play the schedule of ``seed`` to its end, checking the invariants after every
    step; raises :class:`Violation` with the seed and step where one breaks."""
    return Simulation(seed, core_type).run()
