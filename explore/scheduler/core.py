"""The scheduler's decisions, with no process, pipe, clock or storage in them.

:class:`Core` owns what the run holds: each worker's arena (mirrored as a free list),
the trials placed there and the stacks, the paused trials and the candidates waiting
for room.  Events come in (:mod:`.commands`: a report, a trial's end, a worker's death,
a candidate admitted, the time, Ctrl-C) and it answers with commands, in order: start
a candidate at an offset, continue, pause or stop a trial, regroup a stack, note and
tell a trial's end.  The loop (:mod:`.loop`) carries them out and turns the workers'
messages into events; the pruner's word comes from a :class:`~.policy.Policy`.

Because nothing here waits or reads the outside, every decision is a function of the
events so far: the tests drive it directly, and a seeded simulation
(``tests/explore/scheduler/``) runs many schedules against its invariants (the placed
bytes never exceed the budget, every trial in hand ends once, no paused trial is lost).

>>> from explore.scheduler.commands import Tick
>>> from explore.scheduler.telemetry import RunStats
>>> core = Core(policy=None, stats=RunStats(1 << 30))  # type: ignore[arg-type]
>>> core.handle(Tick(1.5)), core.now
([], 1.5)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.trial import TrialState

from engine.alignment import align_up
from engine.free_list import FreeList
from explore.scheduler.commands import (
    Admitted,
    Command,
    Event,
    Failed,
    Finished,
    Idle,
    Interrupted,
    Launch,
    Measure,
    Moved,
    Note,
    RegroupedStack,
    Reported,
    Send,
    Tell,
    Tick,
    WorkerDied,
)
from explore.scheduler.placement import Placement, Stack, Worker, find_spot
from explore.scheduler.policy import PRUNE, Policy
from explore.scheduler.protocol import (
    Continue,
    Done,
    Part,
    Pause,
    Regroup,
    Report,
    Stop,
    TrialFailed,
)
from explore.scheduler.stacking import Pending, part_program
from explore.scheduler.telemetry import RunStats


class Core:
    """The decisions of one driver's run, within the budget and the measured bytes of
    ``stats`` (whose counts and best value it keeps); ``lockstep``: one trial runs at a
    time, continued round by round in an order that depends on nothing but the events
    (reproducible runs); ``part``: compiles a stack's members as a program of their own
    (regrouping).  Times (``Tick``, the workers' stamps) are seconds since the run began."""

    def __init__(self, policy: Policy, stats: RunStats, *, lockstep: bool = False,
                 part: Callable[[Stack, list[int]], Any] = part_program) -> None:
        self.policy, self.stats, self.lockstep, self.part = policy, stats, lockstep, part
        self.counts = stats.counts
        self.workers: dict[int, Worker] = {}
        self.waiting: list[Pending] = []
        self.now = 0.0
        self.ready: list[tuple[Worker, Placement]] = []  # lockstep: to continue, in turn
        self.in_flight: int | None = None  # lockstep: the trial the worker is running
        self.stack_numbers = -1  # a stack's own number: negative, never a trial's
        self._regroups_waiting = False  # some stack's regroup_due is set
        # Stacks running with members masked for want of room to regroup: due again
        # when memory is given back.
        self._masked: list[tuple[Worker, Stack]] = []
        self._out: list[Command] = []

    # -- the interface -------------------------------------------------------------------
    def handle(self, event: Event) -> list[Command]:
        """Decide on ``event``; the commands it leads to, in order."""
        match event:
            case Tick(now=now):
                self.now = now
            case Admitted(pending=pending):
                self.waiting.append(pending)
            case Reported(worker=i, msg=msg):
                self._reported(self.workers.get(i), msg)
            case Finished(worker=i, msg=msg):
                self._finished(self.workers.get(i), msg)
            case Failed(worker=i, msg=msg):
                self._failed(self.workers.get(i), msg)
            case RegroupedStack(worker=i, number=n):
                self._regrouped(self.workers.get(i), n)
            case WorkerDied(worker=i, exitcode=code, pid=pid):
                self._died(i, code, pid)
            case Idle():
                self._idle()
            case Interrupted():
                self._interrupted()
        return self.take()

    def take(self) -> list[Command]:
        """The commands decided since last taken."""
        # counted from what is held, so that no way out of a worker (pruned, resumed,
        # failed, its worker died, Ctrl-C) leaves the count behind
        self.counts["paused"] = sum(p.paused is not None for w in self.workers.values()
                                    for p in w.residents.values())
        out, self._out = self._out, []
        return out

    def add_worker(self, w: Worker) -> None:
        """A worker with its arena open (a new one, or one taking a dead one's place)."""
        self.workers[w.index] = w

    def fail(self, trial: Any, reason: str, never_started: bool = False,
             retry: bool = False) -> None:
        """Fail ``trial`` with ``reason``; ``retry``: its process died or was interrupted,
        so a trial with its parameters is queued in the storage (it is not counted)."""
        self._emit(Note(trial, {"fail_reason": reason, "started": not never_started},
                        ending=True),
                   Tell(trial, state=TrialState.FAIL, retry=retry))
        self.counts["failed"] += 1

    def in_hand(self) -> int:
        """Trials held and not paused: what the sampler's look-ahead is counted in."""
        return sum(w.active() for w in self.workers.values())

    def holds(self) -> bool:
        """Whether any trial waits or is held by a worker."""
        return bool(self.waiting) or any(w.residents for w in self.workers.values())

    def room(self) -> int:
        """What the trials' heaps may take of the budget now: the budget less the
        processes' fixed bytes and their measured growth (or the headroom held back for
        it, whichever is more)."""
        s = self.stats
        return s.budget - s.fixed - max(s.growth, s.headroom)

    def heaps(self) -> int:
        """The bytes of the trials' heaps placed in all arenas."""
        return sum(w.heap_bytes() for w in self.workers.values())

    def paused(self) -> list[tuple[Worker, Placement]]:
        return sorted(((w, p) for w in self.workers.values() for p in w.residents.values()
                       if p.paused is not None), key=lambda wp: wp[1].trial.number)

    def _emit(self, *commands: Command) -> None:
        self._out.extend(commands)

    # -- placement ---------------------------------------------------------------------------
    def place(self) -> list[Command]:
        """Put waiting candidates where they fit (the least busy worker with room, best
        fit in its arena); stacks waiting to regroup first, as they hold their memory
        already."""
        self._regroup_due()
        still = []
        batch, self.waiting = self.waiting, []
        heaps, room = self.heaps(), self.room()
        for pend in batch:
            cand = pend.candidate
            spot = find_spot(self.workers, cand)
            # Processes that grew beyond their measured constants take room from the
            # heaps: a trial waits until the ones placed leave enough of the budget, and
            # one that could not fit even with none placed fails with the reason.
            if spot is not None and heaps + spot.size > room:
                if heaps == 0:
                    for trial in pend.trials:
                        self.fail(trial, f"does not fit: the run's processes grew by "
                                  f"{self.stats.growth:,} bytes beyond their measured "
                                  f"constants, and the budget left holds less than its "
                                  f"{spot.size:,}", never_started=True)
                    continue
                spot = None
            if spot is None:
                still.append(pend)
                continue
            heaps += spot.size
            w = spot.worker
            w.free.take(spot.offset, spot.size)
            stack = None
            if pend.stacked:
                numbers = tuple(t.number for t in pend.trials)
                stack = Stack(self._stack_number(), spot.offset, spot.size, spot.program,
                              numbers, dict(zip(numbers, pend.graphs, strict=True)),
                              dict(zip(numbers, pend.optimizers, strict=True)),
                              held=set(numbers))
                w.stacks[stack.number] = stack
            for trial, requeued in zip(pend.trials, pend.requeued, strict=True):
                w.residents[trial.number] = Placement(
                    trial, cand, w.index, spot.offset, 0 if stack else spot.size, self.now,
                    requeued, stack=stack)
            self._emit(Launch(w.index, pend, spot.offset, spot.program, stack))
            if self.lockstep:
                self.in_flight = pend.trials[0].number
        self.waiting = still + self.waiting
        self._emit(Measure())
        return self.take()

    def unplace(self, worker: int, pending: Pending, stack: Stack | None,
                offset: int, size: int) -> None:
        """A launch that never reached its worker (the worker died first): the candidate
        waits again, for another worker."""
        w = self.workers.get(worker)
        if w is not None:
            for t in pending.trials:
                w.residents.pop(t.number, None)
            if stack is not None:
                w.stacks.pop(stack.number, None)
            w.free.release(offset, size)
        self.waiting.append(pending)

    def _stack_number(self) -> int:
        self.stack_numbers -= 1
        return self.stack_numbers + 1

    # -- a worker's messages -------------------------------------------------------------------
    def _regrouped(self, w: Worker | None, number: int) -> None:
        if w is None:
            return
        st = w.stacks.pop(number, None)
        if st is not None:  # the old stack's region is free in the worker now
            w.free.release(st.offset, st.size)
            self._memory_freed()

    def _arrived(self, w: Worker | None, number: int) -> Placement | None:
        if number == self.in_flight:  # lockstep: the worker waits for the next word
            self.in_flight = None
        return None if w is None else w.residents.get(number)

    def _reported(self, w: Worker | None, msg: Report) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        p.started = msg.started
        verdict = self.policy.report(p.trial, msg.round, msg.metrics, p.candidate.heap_bytes)
        if verdict == PRUNE:
            self._prune(w, p)
            # its value at the rung counts there too (Optuna records it before pruning):
            # it may promote a trial paused there, which would otherwise wait for the
            # next report, or be pruned at the end if none came
            self._resume_promoted()
            return
        if verdict is not None:
            p.paused, p.pauses = int(verdict), p.pauses + 1  # the worker holds it, idle
            self._emit(Send(w.index, Pause(msg.number)))
            self._stack_changed(p)  # a member waits apart, the others go on
            self._resume_promoted()
            self._emit(Measure())
            return
        self._resume_promoted()
        if self.policy.gated or self.lockstep:
            self._continue(w, p)

    def _finished(self, w: Worker | None, msg: Done) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        self._release(w, p, regroup=False)  # its stack's members all end together
        self._emit(Note(p.trial, {"pauses": p.pauses, "rounds": msg.rounds,
                                  "switches": msg.switches,
                                  "busy_s": msg.busy_s, "start": msg.started,
                                  "end": msg.ended,
                                  "metrics": {k: v for k, v in msg.metrics.items()
                                              if k != "train_seconds"},
                                  "train_seconds": msg.metrics.get("train_seconds",
                                                                   msg.busy_s),
                                  **({"model_error": msg.model_error} if msg.model_error
                                     else {})},
                        ending=True))
        values = self.policy.values(msg.metrics, p.candidate.heap_bytes)
        self._emit(Tell(p.trial, values if len(values) > 1 else values[0],
                        saved=msg.saved))
        self.counts["complete"] += 1
        if len(values) == 1:
            self.stats.best = self.policy.best(self.stats.best, values[0])
        self._emit(Measure())

    def _failed(self, w: Worker | None, msg: TrialFailed) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        self._release(w, p)
        # a diverged trial's reason stands alone: the worker had no error
        self.fail(p.trial, msg.reason if msg.reason.startswith("diverged:")
                  else f"error in worker {w.index}: {msg.reason}")

    def _died(self, index: int, code: int | None, pid: int) -> None:
        """A worker's trials fail and, once more (unless they already were a repeat), are
        queued with the same parameters, which the next claim of any driver takes first."""
        w = self.workers.pop(index, None)
        if w is None:
            return  # already handled
        self.in_flight = None  # lockstep: what it ran went with it
        for p in list(w.residents.values()):
            self.fail(p.trial, f"worker {index} (pid {pid}) died with exit code {code}",
                      retry=not p.requeued)

    def _idle(self) -> None:
        """Only paused trials are held, and nothing runs that could promote them: a
        waiting trial needs the memory of the one paused longest (passed over by every
        result since), or the run is over for all."""
        paused = self.paused()
        for w, p in paused[:1] if self.waiting else paused:
            self._prune(w, p)

    def _interrupted(self) -> None:
        held = [p.trial for w in self.workers.values() for p in w.residents.values()]
        for trial in held + [t for pend in self.waiting for t in pend.trials]:
            self.fail(trial, "interrupted", retry=True)
        self.waiting = []
        for w in self.workers.values():  # the run ends: nothing is held any more
            w.residents.clear()
            w.stacks.clear()
            w.free = FreeList([(0, w.arena)])
        self.ready, self.in_flight = [], None

    # -- pruning, pausing, promoting -------------------------------------------------------
    def _prune(self, w: Worker, p: Placement, regroup: bool = True) -> None:
        self._emit(Send(w.index, Stop(p.trial.number)))
        self._release(w, p, regroup=regroup)
        self._emit(Note(p.trial, {"rounds": self.policy.last_step(p.trial),
                                  "pauses": p.pauses, "start": p.started, "end": self.now},
                        ending=True),
                   Tell(p.trial, state=TrialState.PRUNED))
        self.counts["pruned"] += 1
        self._emit(Measure())

    def _resume_promoted(self) -> None:
        """Resume each paused trial that the results so far promote at its rung."""
        for w, p in self.paused():
            assert p.paused is not None
            if self.policy.promotable(p.trial, p.paused):
                p.paused = None
                self.counts["resumed"] += 1
                self._continue(w, p)
                self._stack_changed(p)  # it goes on; those still paused wait apart

    def _continue(self, w: Worker, p: Placement) -> None:
        """Let a trial waiting after its report run on; in lockstep, when its turn comes
        (:meth:`go`)."""
        if self.lockstep:
            self.ready.append((w, p))
        else:
            self._emit(Send(w.index, Continue(p.trial.number)))

    def go(self) -> list[Command]:
        """Lockstep: when the worker runs nothing, continue one of the trials ready to go
        on, depth first as a worker would pick (the furthest along, then the oldest)."""
        self.ready = [(w, p) for w, p in self.ready
                      if self.workers.get(w.index) is w and p.trial.number in w.residents]
        if self.in_flight is not None or not self.ready:
            return self.take()
        w, p = max(self.ready, key=lambda wp: (self.policy.last_step(wp[1].trial) or 0,
                                               -wp[1].trial.number))
        self.ready.remove((w, p))
        self.in_flight = p.trial.number
        self._emit(Send(w.index, Continue(p.trial.number)))
        return self.take()

    # -- leaving a worker; stacks regrouped ----------------------------------------------------
    def _release(self, w: Worker, p: Placement, regroup: bool = True) -> None:
        """The trial leaves its worker: its region is free, or, for a member of a stack,
        the stack's once no member is left there (until then, with ``regroup``, the
        others are stacked again without it)."""
        w.residents.pop(p.trial.number, None)
        st = p.stack
        if st is None:
            w.free.release(p.offset, p.size)
            self._memory_freed()
            return
        st.held.discard(p.trial.number)
        if st.held:
            if regroup:
                self._stack_changed(p)
        elif not st.regrouping and w.stacks.get(st.number) is st:
            del w.stacks[st.number]
            w.free.release(st.offset, st.size)
            self._memory_freed()

    def _stack_changed(self, p: Placement) -> None:
        """A member of ``p``'s stack left, paused or resumed: regroup it once the
        round's reports are read (:meth:`_regroup_due`)."""
        if p.stack is not None and p.stack.held:
            p.stack.regroup_due = True
            self._regroups_waiting = True

    def _memory_freed(self) -> None:
        """Memory was given back: stacks that found no room to regroup try again."""
        for _, st in self._masked:
            st.regroup_due = True
            self._regroups_waiting = True
        self._masked.clear()

    def _regroup(self, w: Worker, st: Stack) -> bool:
        """Move what ``st`` still holds into new programs beside it when some member left
        or is paused: the members going on into one (a smaller stack, or one alone),
        each paused member into one of its own.  True once sent; False when the parts
        do not fit the worker's arena now (``regroup_due``: tried again as memory is
        given back), or when nothing needs moving."""
        if st.regrouping or w.stacks.get(st.number) is not st:
            return False
        placed = {m: w.residents[m] for m in st.members if m in st.held}
        going = [m for m in st.members if m in placed and placed[m].paused is None]
        paused = [m for m in st.members if m in placed and placed[m].paused is not None]
        if not placed or (not paused and len(going) == len(st.members)) or not going:
            st.regroup_due = False  # all go on, or all wait: the stack stays as it is
            return False
        groups_ = [going] + [[m] for m in paused]
        programs = [self.part(st, g) for g in groups_]
        heaps, room = self.heaps(), self.room()
        taken: list[tuple[int, int]] = []
        for prog in programs:
            size = align_up(prog.total_bytes)
            fit = w.free.best_fit(size)
            if fit is None or heaps + size > room:
                for off, n in taken:
                    w.free.release(off, n)
                return False
            w.free.take(fit[0], size)
            taken.append((fit[0], size))
            heaps += size
        parts = []
        for g, prog, (offset, size) in zip(groups_, programs, taken, strict=True):
            for m in g:  # in the trial's record (written when it ends)
                self._emit(Moved(m, {"models": len(g), "paused": placed[m].paused is not None,
                                     "at": round(self.now, 3)}))
            if len(g) == 1:
                p = placed[g[0]]
                p.stack, p.offset, p.size = None, offset, size
                parts.append(Part(g[0], prog, offset, tuple(g), p.paused is not None))
                continue
            sub = Stack(self._stack_number(), offset, size, prog, tuple(g),
                        {m: st.graphs[m] for m in g}, {m: st.optimizers[m] for m in g},
                        held=set(g))
            w.stacks[sub.number] = sub
            for m in g:
                placed[m].stack, placed[m].offset = sub, offset
            parts.append(Part(sub.number, prog, offset, tuple(g)))
        st.regrouping, st.regroup_due, st.held = True, False, set()
        self.counts["regrouped"] = self.counts.get("regrouped", 0) + 1
        self._emit(Send(w.index, Regroup(st.number, tuple(parts))))
        return True

    def _regroup_due(self) -> None:
        """Regroup the stacks whose members left or paused, once the reports of a round
        are read (they come together).  A paused member whose heap of its own does not
        fit is pruned instead, as a rung pruner that does not pause would have (holding
        it apart needs memory); a stack that only lost members and finds no room now
        goes on with them masked, and is tried again when memory is given back."""
        if not self._regroups_waiting:
            return
        self._regroups_waiting = False
        for w in list(self.workers.values()):
            for st in list(w.stacks.values()):
                if not st.regroup_due or self.workers.get(w.index) is not w:
                    continue
                if self._regroup(w, st):
                    continue
                stuck = [w.residents[m] for m in st.members if m in st.held and
                         w.residents[m].paused is not None]
                if stuck and len(stuck) < len(st.held):
                    for p in stuck:  # they cannot wait apart: pruned, and the rest go on
                        self._prune(w, p, regroup=False)
                    if not self._regroup(w, st) and st.regroup_due:
                        st.regroup_due = False  # masked until memory is given back
                        self._masked.append((w, st))
                elif st.regroup_due:
                    st.regroup_due = False
                    self._masked.append((w, st))
