"""Where a trial goes: the scheduler's record of each worker's arena, and the choice of
a worker and an offset for a compiled candidate.

Each worker's arena is mirrored here as a :class:`engine.free_list.FreeList` (the
worker itself keeps no allocator: it puts a trial's heap at the offset it is sent).
No processes are involved, so placement is tested without any
(``tests/explore/test_placement.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import optuna

from engine import Program
from engine.alignment import align_up
from engine.free_list import FreeList
from explore.candidate import Candidate


@dataclass
class Placement:
    """A trial held by a worker: its region ``[offset, offset + size)`` of the arena."""

    trial: optuna.trial.Trial
    candidate: Candidate
    worker: int
    offset: int
    size: int
    placed_at: float
    requeued: bool = False
    paused: int | None = None  # the rung it waits at (explore.rungs), if paused
    pauses: int = 0
    started: float | None = None  # when its worker took it (from its first report)


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

    def active(self) -> int:
        """Trials that run or are ready to (not paused at a rung)."""
        return sum(p.paused is None for p in self.residents.values())


@dataclass(frozen=True)
class Spot:
    """Where a candidate is to go, and which of its programs."""

    worker: Worker
    offset: int
    size: int  # the program's bytes, aligned
    program: Program


def find_spot(workers: dict[int, Worker], cand: Candidate) -> Spot | None:
    """The least busy worker that has room, then best fit within its arena: packing
    by memory alone piled every trial into one worker while the other idled.  Where
    the preferred program fits nowhere, the largest of the candidate's smaller ones
    (compiled for smaller validation chunks, :meth:`Candidate.fitting`, each compiled
    only when asked for) that fits a gap is chosen: the trial starts now instead of
    waiting for a bigger hole.  None if no program fits any arena."""
    for prog in cand.fitting():
        size = align_up(prog.total_bytes)
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
