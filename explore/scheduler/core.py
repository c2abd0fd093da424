"""The scheduler's decisions, with no process, pipe, clock or storage in them.

:class:`Core` owns what the run holds: each worker's arena (mirrored as a free list),
the trials placed there and the stacks, the paused trials and the candidates waiting
for room, and the trials switched out of every arena (their state in a file).  Events
come in (:mod:`.commands`: a report, a trial's end, a trial's state written out, a
worker's death, a candidate admitted, the time, Ctrl-C) and it answers with commands,
in order: start a candidate at an offset, continue, pause or stop a trial, switch a
trial out of its arena or back into one, regroup a stack, note and tell a trial's end.
The loop (:mod:`.loop`) carries them out and turns the workers' messages into events;
the pruner's word comes from a :class:`~.policy.Policy`.

**Nothing is pruned for lack of room** (unless ``switch_limit`` stops the states
leaving).  A paused trial holds its region while nothing else wants it; when a
candidate, or a promoted trial, finds no room, paused trials leave (``SwitchOut``: the
worker writes the state to a file and gives the region back), the one standing lowest
at its rung first (:meth:`~.policy.Policy.standing`), until the one waiting fits.  A
promoted trial that is out comes back into any arena with room (``SwitchIn``), before
new candidates are placed.  A region is free in the mirror only once the worker says
the state is written (``LeftArena``), as a Start there could overwrite it before.

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
    DropState,
    Event,
    Failed,
    Finished,
    Idle,
    Interrupted,
    Launch,
    LeftArena,
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
from explore.scheduler.placement import (
    Placement,
    Resuming,
    Spot,
    Stack,
    Worker,
    find_spot,
    state_size,
)
from explore.scheduler.policy import PRUNE, Policy
from explore.scheduler.protocol import (
    SECONDS,
    Continue,
    Done,
    Part,
    Pause,
    Regroup,
    Report,
    Stop,
    SwitchedOut,
    SwitchIn,
    SwitchOut,
    TrialFailed,
)
from explore.scheduler.stacking import Pending, part_program
from explore.scheduler.telemetry import RunStats

# How a trial in hand when the run was stopped (Ctrl-C, SIGTERM, SIGHUP) fails: it is
# queued again and not counted (explore run's last words count them by it).
INTERRUPTED = "interrupted"


class Core:
    """The decisions of one driver's run, within the budget and the measured bytes of
    ``stats`` (whose counts and best value it keeps); ``lockstep``: one trial runs at a
    time, continued round by round in an order that depends on nothing but the events
    (reproducible runs); ``part``: compiles a stack's members as a program of their own
    (regrouping).  ``switching``: paused trials whose room is needed leave for a file
    (False: the one paused longest is pruned instead, and nothing is written out).
    ``rotation`` (the budget's ``in_flight``): up to that many trials are held at once,
    more than the arenas hold, and advanced in turn (:meth:`_rotate`).
    ``switch_limit``: the most bytes of switched-out states at once (None: no limit).
    ``timeout`` (the budget's): the seconds after which no new trial is taken
    (:meth:`takes_new`).  Times (``Tick``, the workers' stamps) are seconds since the
    run began."""

    def __init__(self, policy: Policy, stats: RunStats, *, lockstep: bool = False,
                 part: Callable[[Stack, list[int]], Any] = part_program,
                 switching: bool = True, rotation: int | None = None,
                 switch_limit: int | None = None, timeout: float | None = None) -> None:
        self.policy, self.stats, self.lockstep, self.part = policy, stats, lockstep, part
        self.switching, self.rotation = switching, rotation
        self.switch_limit, self.timeout = switch_limit, timeout
        # rotation: the trial each worker runs now (one at a time, chosen here)
        self.running: dict[int, int] = {}
        self.counts = stats.counts
        self.workers: dict[int, Worker] = {}
        self.waiting: list[Pending] = []
        # Trials switched out of every arena: their state is in a file, they hold no
        # arena bytes.  Paused at a rung, or promoted and waiting for room to come back.
        self.out: dict[int, Placement] = {}
        self.now = 0.0
        self.ready: list[Placement] = []  # lockstep, rotation: to go on in turn (in or out)
        self.in_flight: int | None = None  # lockstep: the trial the worker is running
        self.stack_numbers = -1  # a stack's own number: negative, never a trial's
        self._regroups_waiting = False  # some stack's regroup_due is set
        # Stacks running with members masked for want of room to regroup: due again
        # when memory is given back.
        self._masked: list[tuple[Worker, Stack]] = []
        self._out: list[Command] = []

    @property
    def turns(self) -> bool:
        """Trials go on in the turns the core gives (lockstep, rotation), not as soon
        as the pruner lets them."""
        return self.lockstep or self.rotation is not None

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
            case LeftArena(worker=i, msg=msg):
                self._left(self.workers.get(i), msg)
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
        self.counts["paused"] = len(self.paused())
        self.counts["out"] = len(self.out)
        out, self._out = self._out, []
        return out

    def takes_new(self) -> bool:
        """Whether the run still takes new trials: until ``timeout`` seconds since it
        began, as the last :class:`~.commands.Tick` said (Optuna's ``optimize(timeout=)``).
        After it the trials in hand go on to their end, and paused ones, which no new
        result can promote once nothing else runs, are pruned (:meth:`_idle`) as at the
        end of the trials budget.

        >>> core = Core(policy=None, stats=RunStats(1 << 30), timeout=60)  # type: ignore[arg-type]
        >>> core.takes_new(), core.handle(Tick(60.0)), core.takes_new()
        (True, [], False)
        """
        return self.timeout is None or self.now < self.timeout

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
        """Trials held and not paused, those promoted while switched out included (they
        run once back): what the sampler's look-ahead is counted in."""
        return sum(w.active() for w in self.workers.values()) + \
            sum(p.paused is None for p in self.out.values())

    def holds(self) -> bool:
        """Whether any trial waits, is held by a worker or is switched out."""
        return bool(self.waiting) or bool(self.out) or \
            any(w.residents for w in self.workers.values())

    def idle(self) -> bool:
        """Nothing runs nor is about to: no trial goes on in any worker, none is on its
        way out of an arena and no stack is being regrouped.  Then only
        :class:`~.commands.Idle` moves the run on."""
        return not any(w.active() for w in self.workers.values()) and \
            not self._in_transit()

    def room(self) -> int:
        """What the trials' heaps may take of the budget now: the budget less the
        processes' fixed bytes and their measured growth (or the headroom held back for
        it, whichever is more)."""
        s = self.stats
        return s.budget - s.fixed - max(s.growth, s.headroom)

    def out_bytes(self) -> int:
        """Bytes of switched-out states: those written (as their workers said) and
        those on their way (as :func:`~.placement.state_size` expects)."""
        return sum(p.state for p in self.out.values()) + \
            sum(state_size(p.program) for w in self.workers.values()
                for p in w.residents.values() if p.leaving)

    def _state_of(self, p: Placement) -> int:
        """The bytes ``p``'s state would take out (a stack's member: as the program of
        its own it would leave as)."""
        if p.stack is not None and p.program is None:
            p.program = self.part(p.stack, [p.trial.number])  # kept for its SwitchOut
        return state_size(p.program)

    def _may_leave(self, victims: list[Placement]) -> bool:
        """Whether the states of ``victims`` fit the switch limit beside those out."""
        return self.switch_limit is None or \
            self.out_bytes() + sum(map(self._state_of, victims)) <= \
            self.switch_limit

    def heaps(self) -> int:
        """The bytes of the trials' heaps placed in all arenas."""
        return sum(w.heap_bytes() for w in self.workers.values())

    def paused(self) -> list[tuple[Worker | None, Placement]]:
        """Every trial paused at a rung, oldest first, with its worker (None: switched
        out)."""
        held: list[tuple[Worker | None, Placement]] = [
            (w, p) for w in self.workers.values() for p in w.residents.values()
            if p.paused is not None]
        held += [(None, p) for p in self.out.values() if p.paused is not None]
        return sorted(held, key=lambda wp: wp[1].trial.number)

    def _emit(self, *commands: Command) -> None:
        self._out.extend(commands)

    # -- placement ---------------------------------------------------------------------------
    def place(self) -> list[Command]:
        """Put waiting candidates where they fit (the least busy worker with room, best
        fit in its arena); stacks waiting to regroup first, as they hold their memory
        already, then promoted trials switched out (lockstep: in their turn, :meth:`go`).
        The first that finds no room has paused trials switched out for it
        (:meth:`_make_room`), and those behind it wait until it is placed; where no
        room can be made now, others that fit a gap go on being placed."""
        self._regroup_due()
        if self.rotation is not None:
            self._rotate()
            self._emit(Measure())
            return self.take()
        if not self.lockstep and not self._bring_back():
            self._emit(Measure())
            return self.take()  # a promoted trial waits for room: it goes first
        still: list[Pending] = []
        batch, self.waiting = self.waiting, []
        heaps = self.heaps()
        making = False  # room is being made for the first that found none
        for pend in batch:
            if making:  # those behind it wait: they would take what it is made for
                still.append(pend)
                continue
            cand = pend.candidate
            spot, grown = self._spot(self.workers, cand, heaps)
            if grown:
                self._fail_unstarted(pend, grown)
                continue
            if spot is None:
                if not still and self.switching:  # the first without room: paused trials
                    # make it some
                    making = self._make_room_for(cand)
                still.append(pend)
                continue
            heaps += spot.size
            self._launch(pend, spot)
            if self.lockstep:
                self.in_flight = pend.trials[0].number
        self.waiting = still + self.waiting
        self._emit(Measure())
        return self.take()

    def _launch(self, pend: Pending, spot: Spot) -> None:
        """Start ``pend`` at ``spot``: its region taken, its trials (a stack's too) held."""
        w, cand = spot.worker, pend.candidate
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
                requeued, stack=stack, program=None if stack else spot.program)
        self._emit(Launch(w.index, pend, spot.offset, spot.program, stack))

    def _spot(self, workers: dict[int, Worker], cand: Any,
              heaps: int) -> tuple[Spot | None, int]:
        """Where ``cand`` goes in ``workers`` within the room the budget leaves beside
        ``heaps`` placed: (its spot, 0); (None, 0) while it waits; (None, its bytes)
        when it could not fit even with none placed, as the processes grew beyond their
        measured constants (they take room from the heaps): it fails, saying so."""
        spot = find_spot(workers, cand, most=self.room() - heaps)
        if spot is None and heaps == 0:
            grown = find_spot(workers, cand)
            if grown is not None:
                return None, grown.size
        return spot, 0

    def _fail_unstarted(self, pend: Pending, size: int) -> None:
        """``pend`` cannot fit even with nothing placed (:meth:`_spot`)."""
        for trial in pend.trials:
            self.fail(trial, self._grown(size), never_started=True)

    def _fail_out(self, p: Placement, size: int) -> None:
        """The switched-out ``p`` cannot come back even with nothing placed."""
        del self.out[p.trial.number]
        self._emit(DropState(p.trial.number))
        self.fail(p.trial, self._grown(size))

    def _grown(self, size: int) -> str:
        return (f"does not fit: the run's processes grew by {self.stats.growth:,} bytes "
                f"beyond their measured constants, and the budget left holds less than "
                f"its {size:,}")

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

    # -- switching out of an arena and back in -------------------------------------------
    def _in_transit(self) -> bool:
        """Whether a trial is on its way out of an arena or a stack is being regrouped:
        memory is about to be given back."""
        return any(p.leaving for w in self.workers.values() for p in w.residents.values()) \
            or any(st.regrouping for w in self.workers.values() for st in w.stacks.values())

    def _idle_on(self, w: Worker) -> list[Placement]:
        """The trials of ``w`` that could leave its arena now, in the order they would:
        alone (a stack's member cannot yet) and idle in the worker: paused at a rung,
        or, in lockstep, waiting for their turn (nothing runs between two turns)."""
        ready = {id(q) for q in self.ready}
        idle = [p for p in w.residents.values()
                if not p.leaving and (
                    (p.stack is None and p.program is not None and
                     (p.paused is not None or (id(p) in ready and not self._runs(p)))) or
                    (p.stack is not None and p.paused is not None and
                     not p.stack.regrouping))]
        return sorted(idle, key=self._leave_order)

    def _runs(self, p: Placement) -> bool:
        """Whether ``p`` runs a round now (lockstep, rotation: as the core chose)."""
        n = p.trial.number
        return n == self.in_flight or self.running.get(p.worker) == n

    def _leave_order(self, p: Placement) -> tuple[bool, float, int]:
        """Paused trials before those about to run; among them the one standing lowest
        at its rung (the least likely to be promoted soon), then the one paused longest.
        In rotation, of those about to run, the one whose turn is furthest away."""
        if p.paused is None:
            if self.rotation is not None:
                return True, -float(p.rounds), -p.trial.number
            return True, 0.0, p.trial.number
        return False, -self.policy.standing(p.trial, p.paused), p.trial.number

    def _make_room(self, size: int, among: dict[int, Worker] | None = None) -> bool:
        """Switch out paused trials until some arena has a free segment of ``size``
        bytes within the room the budget leaves: in the worker where the fewest must
        leave (then the least busy), taken the lowest standing first, then any that
        turn out not to be needed (a neighbour's region was enough) staying; regions
        already on their way out count as free.  False when no single arena can make
        the room (its trials run, or the processes grew): the one waiting waits.
        ``among``: the workers it may be made in (default: all)."""
        heaps, room = self.heaps(), self.room()
        on_way = {id(p) for w in self.workers.values() for p in w.residents.values()
                  if p.leaving}
        leaving = sum(n for w in self.workers.values() for _, n in _released(w, on_way))

        def fits(w: Worker, victims: list[Placement]) -> bool:
            free = FreeList(list(w.free))
            regions = _released(w, on_way | {id(p) for p in victims})
            for offset, n in regions:
                free.release(offset, n)
            more = sum(n for _, n in regions) - sum(n for _, n in _released(w, on_way))
            return free.best_fit(size) is not None and self._may_leave(victims) and \
                heaps - leaving - more + size <= room

        best: tuple[tuple[int, int, int], Worker, list[Placement]] | None = None
        for w in (self.workers if among is None else among).values():
            victims: list[Placement] = []
            if not fits(w, victims):  # regions on their way out often are enough
                for p in self._idle_on(w):
                    victims.append(p)
                    if fits(w, victims):
                        break
                else:
                    continue
                # any the room is made without stays, the best standing first
                for p in reversed(victims[:-1]):
                    rest = [q for q in victims if q is not p]
                    if fits(w, rest):
                        victims = rest
            key = (len(victims), w.active(), w.index)
            if best is None or key < best[0]:
                best = (key, w, victims)
        if best is None:
            return False
        for p in best[2]:
            self._switch_out(best[1], p)
        return True

    def _make_room_for(self, cand: Any, among: dict[int, Worker] | None = None) -> bool:
        """:meth:`_make_room` for the first of ``cand``'s programs (the preferred, then
        the smaller ones) it can be made for."""
        return any(self._make_room(align_up(prog.total_bytes), among)
                   for prog in cand.fitting())

    def _make_way(self) -> None:
        """Room for what waits that no single arena could make (:meth:`_make_room`)
        while nothing runs: every idle trial leaves, so that the one waiting fits or,
        with nothing placed, fails saying why; a stack's paused member cannot leave
        alone yet, so the one of them paused longest is pruned instead, as is the one
        paused longest when the switch limit lets none leave."""
        left = False
        for w in self.workers.values():
            for p in self._idle_on(w):
                if self._may_leave([p]):
                    self._switch_out(w, p)
                    left = True
        if left:
            return
        if self.switch_limit is not None:  # none may leave: the one paused longest ends
            for held, p in self.paused():
                if held is not None:
                    self._prune(held, p)
                    return

    def _switch_out(self, w: Worker, p: Placement) -> None:
        """``p`` leaves the arena; a stack's member as a program of its own (compiled as
        a regroup would), which its state is written in and it comes back as."""
        p.leaving = True
        if p.stack is not None and p.program is None:
            p.program = self.part(p.stack, [p.trial.number])
        self._emit(Send(w.index, SwitchOut(p.trial.number,
                                           p.program if p.stack is not None else None)))

    def _left(self, w: Worker | None, msg: SwitchedOut) -> None:
        """The worker wrote the trial's state and gave its region back: the region is
        free here too, and the trial is out."""
        p = None if w is None else w.residents.get(msg.number)
        if w is None or p is None or not p.leaving:
            return
        if p.stack is not None:  # the stack goes on without it (regrouped, or masked)
            self._release(w, p)
            p.stack, p.offset, p.size = None, 0, align_up(p.program.total_bytes)
        else:
            del w.residents[msg.number]
            w.free.release(p.offset, p.size)
        if msg.overhead:
            w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        p.leaving, p.moved = False, p.moved + msg.nbytes
        p.state = msg.nbytes
        p.spans.append([self.now])
        self.out[msg.number] = p
        self.counts["switched_out"] = self.counts.get("switched_out", 0) + 1
        self.stats.switch_bytes += msg.nbytes
        self._memory_freed()
        self._emit(Measure())

    def _bring_in(self, p: Placement) -> bool | None:
        """Switch the promoted trial ``p`` back into the arena with room (as a candidate
        is placed), or make room for it: True once sent, False while it waits, None
        when it cannot fit with nothing placed (the processes grew: it fails)."""
        spot, grown = self._spot(self.workers, Resuming(p.program), self.heaps())
        if grown:
            self._fail_out(p, grown)
            return None
        if spot is None:
            self._make_room(align_up(p.program.total_bytes))
            return False
        self._switch_in(p, spot)
        return True

    def _switch_in(self, p: Placement, spot: Spot) -> None:
        """Bring the switched-out ``p`` back into the arena at ``spot``."""
        n, w = p.trial.number, spot.worker
        w.free.take(spot.offset, spot.size)
        del self.out[n]
        p.state = 0  # read back: the worker removes the file
        p.worker, p.offset, p.size = w.index, spot.offset, spot.size
        w.residents[n] = p
        p.spans[-1].append(self.now)
        self._emit(Send(w.index, SwitchIn(n, p.program, spot.offset)))
        self.counts["switched_in"] = self.counts.get("switched_in", 0) + 1

    def _bring_back(self) -> bool:
        """Switch promoted trials back in, oldest first, each continued once in; False
        while one waits for room (new candidates wait behind it)."""
        for p in sorted((p for p in self.out.values() if p.paused is None),
                        key=lambda p: p.trial.number):
            got = self._bring_in(p)
            if got is False:
                return False
            if got:
                self._emit(Send(p.worker, Continue(p.trial.number)))
        return True

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
        if w is not None and self.running.get(w.index) == number:
            del self.running[w.index]  # rotation: its worker is free for the next turn
        return None if w is None else w.residents.get(number)

    def _reported(self, w: Worker | None, msg: Report) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        p.started, p.rounds = msg.started, msg.round
        p.seconds = {k: msg.metrics[k] for k in SECONDS if k in msg.metrics}
        p.validated += msg.validated
        # a round not validated has nothing for the pruner: the trial goes on
        verdict = self.policy.report(p.trial, msg.round, msg.metrics,
                                     p.candidate.heap_bytes) if msg.validated else None
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
        if self.policy.gated or self.turns:
            self._continue(w, p)

    def _finished(self, w: Worker | None, msg: Done) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        self._release(w, p, regroup=False)  # its stack's members all end together
        self._emit(Note(p.trial, {"pauses": p.pauses, "rounds": msg.rounds,
                                  "switches": msg.switches,
                                  "busy_s": msg.busy_s, "start": msg.started,
                                  "end": msg.ended,
                                  "metrics": {k: v for k, v in msg.metrics.items()
                                              if k not in SECONDS},
                                  "train_seconds": msg.metrics.get("train_seconds",
                                                                   msg.busy_s),
                                  "valid_seconds": msg.metrics.get("valid_seconds", 0.0),
                                  **self._work(p, msg.rounds, p.validated + 1),
                                  **({"model_error": msg.model_error} if msg.model_error
                                     else {}),
                                  **self._switch_record(p)},
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
        self.running.pop(index, None)
        for p in list(w.residents.values()):
            self.fail(p.trial, f"worker {index} (pid {pid}) died with exit code {code}",
                      retry=not p.requeued)

    def _idle(self) -> None:
        """Nothing runs and nothing is on its way (:meth:`idle`).  In lockstep the trial
        whose turn it is comes back in (:meth:`_turn`).  A trial that waits for room
        that :meth:`_make_room` could not make in any single arena has every idle trial
        switched out for it (:meth:`_make_way`).  With nothing waiting, no result can
        come to promote the paused trials any more: the run is over for them."""
        if self._in_transit():
            return
        if self.turns and self.ready:
            before = len(self._out)
            self._rotate() if self.rotation is not None else self._turn()
            if len(self._out) > before:
                return
        paused = self.paused()
        if not self.switching:  # the memory of the one paused longest, passed over by
            # every result since, is needed
            for w, p in paused[:1] if self.waiting else paused:
                self._prune(w, p)
            return
        if self.waiting or self.ready or any(p.paused is None for p in self.out.values()):
            self._make_way()
            return
        for w, p in paused:
            self._prune(w, p)

    def _interrupted(self) -> None:
        held = [p.trial for w in self.workers.values() for p in w.residents.values()]
        for n in self.out:
            self._emit(DropState(n))
        held += [p.trial for p in self.out.values()]
        for trial in held + [t for pend in self.waiting for t in pend.trials]:
            self.fail(trial, INTERRUPTED, retry=True)
        self.waiting, self.out = [], {}
        for w in self.workers.values():  # the run ends: nothing is held any more
            w.residents.clear()
            w.stacks.clear()
            w.free = FreeList([(0, w.arena)])
        self.ready, self.in_flight = [], None
        self.running.clear()

    # -- pruning, pausing, promoting -------------------------------------------------------
    def _prune(self, w: Worker | None, p: Placement, regroup: bool = True) -> None:
        """Stop ``p`` (held by ``w``; None: switched out, its file dropped) as pruned."""
        if w is None:
            del self.out[p.trial.number]
            self._emit(DropState(p.trial.number))
        else:
            self._emit(Send(w.index, Stop(p.trial.number)))
            self._release(w, p, regroup=regroup)
        rounds = self.policy.last_step(p.trial)
        self._emit(Note(p.trial, {"rounds": rounds,
                                  "pauses": p.pauses, "start": p.started, "end": self.now,
                                  **p.seconds, **self._work(p, p.rounds, p.validated),
                                  **self._switch_record(p)},
                        ending=True),
                   Tell(p.trial, state=TrialState.PRUNED))
        self.counts["pruned"] += 1
        self._emit(Measure())

    def _spent(self, w: Worker, spent: dict[str, float]) -> None:
        """The worker's seconds so far by what they went to (``protocol.SPENT``), kept
        by the run's figures (where a dead worker's last word stays)."""
        if spent:
            self.stats.spent[w.index] = dict(spent)

    def _work(self, p: Placement, rounds: int, validated: int) -> dict[str, Any]:
        """The model arithmetic of ``p``'s ``rounds`` rounds trained and ``validated``
        validated (its own program's FLOPs for the training rows and the validation
        rows, :mod:`explore.utilisation`), for its record; added to the run's figures."""
        per_train, per_valid = p.candidate.round_flops
        train, valid = rounds * per_train, validated * per_valid
        self.stats.flops["train"] += train
        self.stats.flops["valid"] += valid
        return {"flops": train + valid} if train or valid else {}

    def _switch_record(self, p: Placement) -> dict[str, Any]:
        """What a trial's record says of its switches out of an arena (nothing if none):
        how many, the bytes written out, and when it was out (``out_spans``: [left,
        back] in seconds since the run began; back is the end for a trial that ended
        out)."""
        if not p.spans:
            return {}
        spans = [[round(t, 3) for t in (*span, self.now)[:2]] for span in p.spans]
        return {"switched_out": len(p.spans), "switch_bytes": p.moved, "out_spans": spans}

    def _resume_promoted(self) -> None:
        """Resume each paused trial that the results so far promote at its rung; one
        switched out (or on its way out) comes back into an arena with room first: in
        its turn (lockstep, :meth:`go`), else before new candidates (:meth:`place`)."""
        for w, p in self.paused():
            assert p.paused is not None
            if self.policy.promotable(p.trial, p.paused):
                p.paused = None
                self.counts["resumed"] += 1
                if w is None or p.leaving:
                    if self.turns:
                        self.ready.append(p)
                    continue
                self._continue(w, p)
                self._stack_changed(p)  # it goes on; those still paused wait apart

    def _continue(self, w: Worker, p: Placement) -> None:
        """Let a trial waiting after its report run on; in lockstep, when its turn comes
        (:meth:`go`); in rotation, in its turn (:meth:`_rotate`)."""
        if self.turns:
            self.ready.append(p)
        else:
            self._emit(Send(w.index, Continue(p.trial.number)))

    def go(self) -> list[Command]:
        """Lockstep: when the worker runs nothing, continue one of the trials ready to go
        on, depth first as a worker would pick (the furthest along, then the oldest).
        Rotation: each worker that runs nothing is given the next turn (:meth:`_rotate`)."""
        if self.rotation is not None:
            self._rotate()
        else:
            self._turn()
        return self.take()

    def in_rotation(self) -> int:
        """Trials in hand: held by a worker, switched out or waiting for room (what
        the budget's ``in_flight`` bounds)."""
        return sum(len(w.residents) for w in self.workers.values()) + len(self.out) + \
            sum(len(pend.trials) for pend in self.waiting)

    def _rotate(self) -> None:
        """Rotation: every worker that runs nothing is given the next turn.  The turns
        go to the candidates waiting and the trials ready to go on (in an arena or
        switched out), the one fewest rounds along first, then the oldest: so the trials
        in hand advance round by round, whatever the memory.  A trial ready in a busy
        worker's arena waits for it; one out, or a candidate, goes to a free worker
        with room, or has trials waiting their turn there switched out for it (the one
        whose turn is furthest away first; paused trials before them), and those
        behind it wait until it is in."""
        self.ready = [p for p in self.ready if self._holds(p)]
        free = {i: w for i, w in self.workers.items() if i not in self.running}
        blocked = False  # a turn found no room, and none could be made for it
        turns: list[tuple[int, int, Placement | Pending]] = \
            [(p.rounds, p.trial.number, p) for p in self.ready] + \
            [(0, pend.trials[0].number, pend) for pend in self.waiting]
        for _, _, item in sorted(turns, key=lambda t: t[:2]):
            if not free:
                return
            if isinstance(item, Placement):
                if item.leaving:
                    continue  # it can go once its state is written
                if item.trial.number not in self.out:
                    if item.worker in free:
                        del free[item.worker]
                        self._go_on(item)
                    continue
                cand: Any = Resuming(item.program)
            else:
                cand = item.candidate
            spot, grown = self._spot(free, cand, self.heaps())
            if grown:
                if isinstance(item, Placement):
                    self.ready.remove(item)
                    self._fail_out(item, grown)
                else:
                    self.waiting.remove(item)
                    self._fail_unstarted(item, grown)
                continue
            if spot is None:
                if self._make_room_for(cand, among=free):
                    return  # those behind it wait: they would take what is made for it
                blocked = True
                continue  # no room can be made now: others that fit may go on
            del free[spot.worker.index]
            if isinstance(item, Placement):
                self._switch_in(item, spot)
                self._go_on(item)
            else:
                self.waiting.remove(item)
                self._launch(item, spot)
                self.running[spot.worker.index] = item.trials[0].number
        if blocked and not self.running and not self._in_transit():
            self._make_way()  # room only all of them leaving can make, or none

    def _go_on(self, p: Placement) -> None:
        """Rotation: ``p`` (in an arena) runs its next round."""
        self.ready.remove(p)
        self.running[p.worker] = p.trial.number
        self._emit(Send(p.worker, Continue(p.trial.number)))

    def _turn(self) -> None:
        """:meth:`go`'s choice, whatever the memory: the same trial goes on whether it
        stayed in the arena or was switched out (then it comes back first, paused
        trials leaving for it), so a seeded run is the same at any budget."""
        self.ready = [p for p in self.ready if self._holds(p)]
        if self.in_flight is not None or not self.ready:
            return
        for p in sorted(self.ready, key=lambda p: (self.policy.last_step(p.trial) or 0,
                                                   -p.trial.number), reverse=True):
            if p.leaving:
                return  # it comes back once its state is written
            if p.trial.number in self.out:
                got = self._bring_in(p)
                if got is None or (got is False and self._in_transit()):
                    return  # failed (it cannot fit), or room is being made for it
                if got is False:
                    continue  # no room can be made for it now (the processes grew, or
                    # the switch limit): the next in turn that is in an arena goes on
            self.ready.remove(p)
            self.in_flight = p.trial.number
            self._emit(Send(p.worker, Continue(p.trial.number)))
            return
        self._make_way()  # none can go on: it fits once all leave, or fails

    def _holds(self, p: Placement) -> bool:
        """Whether ``p`` is still held here: switched out, or by its (live) worker."""
        w = self.workers.get(p.worker)
        return self.out.get(p.trial.number) is p or \
            (w is not None and w.residents.get(p.trial.number) is p)

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
        placed = {m: w.residents[m] for m in st.members if m in st.held and
                  not w.residents[m].leaving}  # one leaving is not moved
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
                p.stack, p.offset, p.size, p.program = None, offset, size, prog
                parts.append(Part(g[0], prog, offset, tuple(g), p.paused is not None))
                continue
            sub = Stack(self._stack_number(), offset, size, prog, tuple(g),
                        {m: st.graphs[m] for m in g}, {m: st.optimizers[m] for m in g},
                        held=set(g))
            w.stacks[sub.number] = sub
            for m in g:
                placed[m].stack, placed[m].offset, placed[m].program = sub, offset, None
            parts.append(Part(sub.number, prog, offset, tuple(g)))
        st.regrouping, st.regroup_due, st.held = True, False, set()
        self.counts["regrouped"] = self.counts.get("regrouped", 0) + 1
        self._emit(Send(w.index, Regroup(st.number, tuple(parts))))
        return True

    def _regroup_due(self) -> None:
        """Regroup the stacks whose members left or paused, once the reports of a round
        are read (they come together).  A paused member whose heap of its own does not
        fit leaves the arena alone (switched out as a program of its own; pruned only
        where switching is off or at its limit); a stack that only lost members and
        finds no room now goes on with them masked, and is tried again when memory is
        given back."""
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
                         w.residents[m].paused is not None and not w.residents[m].leaving]
                if stuck and len(stuck) < len(st.held):
                    for p in stuck:  # they cannot wait apart in the arena: they wait
                        # out of it (pruned where they cannot), and the rest go on
                        if self.switching and self._may_leave([p]):
                            self._switch_out(w, p)
                        else:
                            self._prune(w, p, regroup=False)
                    if not self._regroup(w, st) and st.regroup_due:
                        st.regroup_due = False  # masked until memory is given back
                        self._masked.append((w, st))
                elif st.regroup_due:
                    st.regroup_due = False
                    self._masked.append((w, st))


def _released(w: Worker, gone: set[int]) -> list[tuple[int, int]]:
    """The regions of ``w``'s arena given back once the trials ``gone`` (their
    Placements' ids) leave: each one alone, and each stack whose members held there
    all leave."""
    regions = [(p.offset, p.size) for p in w.residents.values()
               if id(p) in gone and p.stack is None]
    regions += [(st.offset, st.size) for st in w.stacks.values()
                if st.held and not st.regrouping and
                all(id(w.residents[m]) in gone for m in st.held)]
    return regions

