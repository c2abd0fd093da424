"""The trials resident in a worker's arena: each one's record (:class:`Resident`: a
trial alone or a stack, in its own region) and the arena they share
(:class:`ArenaHost`), with their coming in, going out and regrouping, and the choice
of which runs next."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.runtime.arena import Arena
from engine.runtime.heap import CalcHeap
from engine.runtime.members import member_losses, move_member
from engine.runtime.vm import VM
from explore.procmem import PssMeter
from explore.scheduler.protocol import SPENT, Regroup, Regrouped, SwitchOut
from explore.scheduler.worker.device import release_heap_memory
from explore.scheduler.worker.validation import Validation


@dataclass
class Resident:
    """A trial (or a stack of them) held in the worker's arena: its VM on its region,
    its progress and clock, and, for a stack, where each member stands."""

    number: int
    vm: Any
    rounds: int
    rng: np.random.Generator
    batch: int  # training mini-batch (the program may be compiled for a bigger one)
    offset: int  # its region of the arena, given back when the trial leaves
    nbytes: int
    validation: Validation  # what the eval path measures, and the metrics made of it
    gated: bool = False  # after a report, wait for "continue" (or "pause": at a rung)
    validate_every: int = 1  # validate after every k-th round, and after the last
    refresh: int = 0  # mini-batches forwarded before validating (batch norms' statistics)
    paused: bool = False  # at a rung: the worker may start another trial meanwhile
    round: int = 0
    runnable: bool = True
    started: float = field(default_factory=time.time)
    switches: int = 0
    busy_s: float = 0.0  # seconds it has run (training and validating)
    valid_s: float = 0.0  # of those, validating
    # A stack (Start.members): its trials in model order; otherwise [number].  The
    # others are a stack's alone: members still running, members whose word after a
    # report has not come (gated), members paused at a rung (the stack waits for the
    # scheduler's Regroup), and where each member's weights are written.
    members: list[int] = field(default_factory=list)
    live: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    save_to: dict[int, str | None] = field(default_factory=dict)
    losses: str | None = None  # the per-member training losses of a stack

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [self.number]
        self.live = set(self.members) if not self.live else self.live

    @property
    def stacked(self) -> bool:
        return self.losses is not None

    def index(self, member: int) -> int | None:
        """The member's model in the program (None: the program runs one model)."""
        return self.members.index(member) if self.stacked else None

    def word(self, member: int, go: bool | None) -> None:
        """The scheduler's word on ``member``: go on (True), pause at a rung (False),
        or stop (None); what the resident may do next follows."""
        self.waiting.discard(member)
        self.held.discard(member)
        if go is None:
            self.live.discard(member)
        elif not go:
            self.held.add(member)
        self.paused = bool(self.held)
        self.runnable = not self.waiting and not self.held


class ArenaHost:
    """A worker's arena, allocated once, and the residents in its regions: what every
    message from the scheduler reads and changes.  It lives in the worker process
    alone; the scheduler hears of it through :mod:`explore.scheduler.protocol`'s
    messages, sent on ``conn``."""

    def __init__(self, conn: Any, arrays: dict[str, np.ndarray], device: str, arena: Arena,
                 switch_dir: str) -> None:
        self.conn = conn
        self.arrays = arrays  # the shared data set, mapped read-only
        self.device = device
        self.arena = arena
        self.switch_dir = switch_dir  # where switched-out trials' states are written
        self.residents: dict[int, Resident] = {}
        self.owner: dict[int, int] = {}  # a trial's number -> the resident (a stack) holding it
        self.order: list[int] = []
        self.running: int | None = None  # the resident in the middle of a round, if any
        self.deferred: list[Regroup | SwitchOut] = []  # for that resident, at the round's end
        self.spent = dict.fromkeys(SPENT, 0.0)  # this worker's seconds, by what they went to
        self.memory = PssMeter()  # read at every report: cheaply between full readings

    def pick(self) -> int | None:
        """Depth first: the runnable trial furthest along; a trial not yet begun waits
        while another part way can run (it is ready for the moment that one ends, so
        the worker never idles between trials, and the pruner learns as early as it
        can).  One part way that waits for its word does not hold it back: in rotation
        that word comes only after the new trial's turn."""
        residents, order = self.residents, self.order
        runnable = [n for n in order if residents[n].runnable]
        if not runnable:
            return None
        best = max(runnable, key=lambda n: (residents[n].round, -order.index(n)))
        if residents[best].round == 0 and any(r.round > 0 and not r.paused and r.runnable
                                              for r in residents.values()):
            return None
        return best

    def overhead_now(self) -> int:
        """This process's memory beyond the heaps of the trials it holds (their regions
        are in use, page for page) and its share of the data set's shared pages (counted
        once, whole, as the run's data): on the CPU, what its measured constant has
        become."""
        if self.device != "cpu":
            return 0
        return max(0, self.memory.read_own() - sum(r.nbytes for r in self.residents.values()))

    def valid_rows(self) -> int:
        """The number of validation rows, which each trial's per-row outputs hold."""
        return len(self.arrays["y_valid"])

    def drop(self, number: int) -> None:
        """Resident ``number`` leaves: its region of the arena is given back."""
        r = self.residents.pop(number, None)
        if number in self.order:
            self.order.remove(number)
        if r is not None:  # its region of the arena stops counting as used
            for m in r.members:
                if self.owner.get(m) == number:
                    del self.owner[m]
            r.vm = None
            self.arena.release(r.offset, r.nbytes)
            release_heap_memory()

    def host(self, number: int, prog: Any, offset: int, seed: int, rounds: int, batch: int,
             gated: bool, validation: Validation, members: list[int],
             save_to: dict[int, str | None], initialize: bool = True) -> Resident:
        """Bind ``prog`` at ``offset`` of the arena as resident ``number`` (its weights
        initialized from ``seed`` unless ``initialize`` is False: a state read next)."""
        t0 = time.perf_counter()
        region = self.arena.buffer[offset:offset + prog.total_bytes]
        vm = VM(prog, seed=seed, heap=CalcHeap(self.arena.backend, prog.zone_bytes,
                                               buffer=region),
                initialize=initialize)
        r = Resident(number, vm, rounds, np.random.default_rng(seed), batch, offset,
                     prog.total_bytes, validation, gated=gated, members=list(members),
                     save_to=save_to, losses=member_losses(prog))
        self.residents[number] = r
        for m in r.members:
            self.owner[m] = number
        self.order.append(number)
        self.spent["setup"] += time.perf_counter() - t0
        return r

    def leave(self, r: Resident, number: int) -> None:
        """Trial ``number`` leaves resident ``r``: a trial alone is dropped; a stack's
        member stops there, and the stack ends with its last member (unless a Regroup
        of it waits for the round's end)."""
        if not r.stacked:
            self.drop(r.number)
            return
        r.word(number, None)
        if self.owner.get(number) == r.number:
            del self.owner[number]
        if not r.live and not any(isinstance(d, Regroup) and d.number == r.number
                                  for d in self.deferred):
            self.drop(r.number)

    def regroup(self, msg: Regroup) -> None:
        """Move the stack's members into the parts, then drop the stack."""
        old = self.residents.get(msg.number)
        if old is None:  # it ended (its last round) before the regroup reached it
            self.conn.send(Regrouped(msg.number))
            return
        for part in msg.parts:
            r = self.host(part.number, part.program, part.offset, 0, old.rounds, old.batch,
                          old.gated, Validation.of(part.program, self.valid_rows(),
                                                   old.validation.target_std),
                          list(part.members), {m: old.save_to.get(m) for m in part.members})
            for m in part.members:
                move_member(old.vm, old.index(m), r.vm, r.index(m))
            r.rng = copy.deepcopy(old.rng)
            r.round, r.started, r.switches, r.busy_s, r.valid_s = \
                old.round, old.started, old.switches, old.busy_s, old.valid_s
            r.validate_every, r.refresh = old.validate_every, old.refresh
            r.waiting = old.waiting & set(part.members)
            r.held = set(part.members) if part.paused else set()
            r.paused = part.paused
            r.runnable = not r.waiting and not r.held
        for m in old.members:  # those in no part end with the stack (not one gone out)
            if self.owner.get(m) == old.number:
                del self.owner[m]
        for part in msg.parts:
            for m in part.members:
                self.owner[m] = part.number
        self.drop(msg.number)
        self.conn.send(Regrouped(msg.number))
