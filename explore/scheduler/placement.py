"""Where a trial goes: the scheduler's record of each worker's arena, and the choice of
a worker and an offset for a compiled candidate.

Each worker's arena is mirrored here as a :class:`engine.free_list.FreeList` (the
worker itself keeps no allocator: it puts a trial's heap at the offset it is sent).
No processes are involved, so placement is tested without any
(``tests/explore/test_placement.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

import optuna

from engine import Program
from engine.alignment import align_up
from engine.free_list import FreeList


class Sized(Protocol):
    """What placement reads of a compiled candidate (:class:`explore.candidate.Candidate`,
    or a simulation's): its heap, its training batch and its programs, the preferred
    first."""

    @property
    def heap_bytes(self) -> int: ...

    @property
    def train_batch(self) -> int: ...

    def fitting(self) -> Iterator[Any]: ...

    @property
    def round_flops(self) -> tuple[int, int]:
        """The model's FLOPs in a round: training over the rows, validating them."""
        ...


@dataclass
class Stack:
    """Trials trained as one stacked program (:mod:`engine.compile.stack`) in the region
    ``[offset, offset + size)`` of a worker's arena.  ``members`` are their numbers in
    the program's model order; ``held`` those the scheduler still holds there (a
    member pruned, failed or moved out is not).  Each member also has a
    :class:`Placement` of its own (of size 0: the region is the stack's)."""

    number: int  # negative: never a trial's number
    offset: int
    size: int
    program: Program
    members: tuple[int, ...]
    graphs: dict[int, Any]  # each member's CalcGraph, to stack again without some
    optimizers: dict[int, Any]  # and its optimizer (its learning rate)
    held: set[int] = field(default_factory=set)
    # A Regroup is on its way to the worker: the region stays taken until its
    # Regrouped comes back (the worker copies the members out of it first).
    regrouping: bool = False
    # Members left it (or one was paused) but the parts did not fit yet: try again
    # when memory is given back.
    regroup_due: bool = False


@dataclass
class Placement:
    """A trial held by a worker: its region ``[offset, offset + size)`` of the arena,
    or, for a member of a stack, the stack's (``stack``; ``size`` 0).  A trial
    switched out of every arena keeps its Placement (in ``Core.out``) with its
    ``program``, the one its state fits, for the arena it comes back into."""

    trial: optuna.trial.Trial
    candidate: Sized
    worker: int
    offset: int
    size: int
    placed_at: float
    requeued: bool = False
    paused: int | None = None  # the rung it waits at (explore.rungs), if paused
    pauses: int = 0
    started: float | None = None  # when its worker took it (from its first report)
    rounds: int = 0  # rounds it has reported
    stack: Stack | None = None
    program: Any = None  # what it runs as (engine.Program); None: as part of a stack
    # A SwitchOut is on its way: the region stays taken until the worker says the
    # state is written (a Start there could overwrite it before).
    leaving: bool = False
    state: int = 0  # bytes of its state's file while it is out
    moved: int = 0  # bytes of state written out by its switches (one per span below)
    # when it left an arena and came back (seconds since the run began; [left] alone
    # while it is out), for its record and the timeline
    spans: list[list[float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # as last reported (SECONDS)
    validated: int = 0  # rounds reported validated (training.validate_every skips some)


@dataclass
class Worker:
    """The scheduler's view of one worker process: its pipe, its measured overhead,
    its arena's free segments and the trials it holds."""

    index: int
    process: Any  # multiprocessing.Process
    conn: Connection
    device: int = 0  # the device (budget.devices) its arena is on
    overhead: int = 0  # measured when it started (after its warm-up)
    overhead_now: int = 0  # as it last reported (0: nothing reported yet)
    arena: int = 0
    pid: int = 0
    free: FreeList = field(default_factory=FreeList)  # the arena's free segments, mirrored
    residents: dict[int, Placement] = field(default_factory=dict)
    stacks: dict[int, Stack] = field(default_factory=dict)

    def active(self) -> int:
        """Programs that run or are ready to: trials not paused at a rung, a stack
        counted once (its members run together)."""
        alone = sum(p.paused is None and p.stack is None for p in self.residents.values())
        stacks = {id(p.stack) for p in self.residents.values()
                  if p.paused is None and p.stack is not None}
        return alone + len(stacks)

    def heap_bytes(self) -> int:
        """The arena's bytes in use: trials alone and stacks (one being regrouped
        too, until the worker has copied its members out)."""
        return sum(p.size for p in self.residents.values()) + \
            sum(s.size for s in self.stacks.values())


@dataclass(frozen=True)
class Resuming:
    """A switched-out trial as placement sees it: one program, the one its state was
    written from (no smaller fallback: the state fits that layout only)."""

    program: Program
    train_batch: int = 0

    @property
    def heap_bytes(self) -> int:
        return int(self.program.total_bytes)

    def fitting(self) -> Iterator[Any]:
        yield self.program


# Room for a state file's header (the program's layout, counters, the generator's
# state: a few kB) beside its bytes
STATE_HEADER = 64 << 10


def state_size(program: Any) -> int:
    """The bytes a state of ``program`` switched out takes (its parameters and optimizer
    slots, :meth:`engine.VM.write_state`), known before it is written: unconsumed
    gradients, rare at a round's end, would add theirs.  A program that does not say
    (a simulation's) is taken as its whole heap."""
    state = getattr(program, "state_bytes", None)
    if state is None:
        return align_up(int(program.total_bytes))
    return int(state) + int(program.zone_bytes.get("optimizer", 0)) + STATE_HEADER


@dataclass(frozen=True)
class Spot:
    """Where a candidate is to go, and which of its programs."""

    worker: Worker
    offset: int
    size: int  # the program's bytes, aligned
    program: Program


def find_spot(workers: dict[int, Worker], cand: Sized, most: int | None = None) -> Spot | None:
    """The least busy worker that has room, then best fit within its arena: packing
    by memory alone piled every trial into one worker while the other idled.  Where
    the preferred program fits nowhere, the largest of the candidate's smaller ones
    (compiled for smaller validation chunks, ``Candidate.fitting``, each compiled only
    when asked for) that fits a gap is chosen: the trial starts now instead of
    waiting for a bigger hole.  ``most``: the bytes the budget leaves for it (a program
    bigger is passed over).  None if no program fits any arena."""
    for prog in cand.fitting():
        size = align_up(prog.total_bytes)
        if most is not None and size > most:
            continue
        fits = []
        for w in workers.values():
            fit = w.free.best_fit(size)
            if fit is not None:
                offset, segment = fit
                fits.append((w.active(), segment - size, offset, w.index))
        if fits:
            _, _, offset, index = min(fits)
            return Spot(workers[index], offset, size, prog)
    return None
