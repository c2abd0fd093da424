"""The scheduler's placement, without processes: best fit into the workers' free
segments, and the largest of a candidate's smaller programs (compiled for smaller
validation chunks) placed where only it fits."""

from __future__ import annotations

from typing import Any

import optuna

from engine.free_list import FreeList
from explore.candidate import compile_candidate
from explore.datasets import load_digits
from explore.protocol import Start, ToWorker
from explore.sampling import fixed
from explore.scheduler import Placement, Scheduler, Worker
from explore.scheduler.placement import find_spot
from explore.scheduler.stacking import Pending
from explore.space import parse_space
from tests.explore.cli_run import IN_TEST

SPACE = {"name": "p", "dataset": "digits", "budget": {"trials": 3, "rounds": 1,
                                                      "memory": "64MB", "workers": 1},
         "pruner": "none", "training": {"batch_size": 8}}


class Pipe:
    def __init__(self) -> None:
        self.sent: list[ToWorker] = []

    def send(self, msg: ToWorker) -> None:
        self.sent.append(msg)


def test_a_gap_too_small_for_the_preferred_program_takes_the_largest_that_fits() -> None:
    space = parse_space(SPACE)
    cand = compile_candidate(space, fixed(space), 10_000_000)
    assert cand.program.batch_size == 359 and cand.fallback_batches == (179, 89, 44, 22, 11, 8)
    sizes = {p.batch_size: p.total_bytes for p in cand.fitting()}
    assert [sizes[b] for b in (359, 179, 89, 44, 22, 11, 8)] == sorted(sizes.values())[::-1]
    big, small = sizes[359], sizes[44]
    # One of each, not two big: a gap of 44 rows' program (and less than 89 rows').
    arena = -(-big // 64) * 64 + -(-small // 64) * 64 + 64
    sched = Scheduler(space, optuna.create_study(direction="maximize"), load_digits(),
                      workers=1, memory=space.budget.memory, device="cpu", main=IN_TEST)
    try:
        pipe = Pipe()
        sched.workers = {0: Worker(0, None, pipe, arena=arena,  # type: ignore[arg-type]
                                   free=FreeList([(0, arena)]))}
        sched.stats.arena = arena
        for _ in range(3):
            claim = sched.live.claim()
            assert claim is not None
            sched.waiting.append(Pending([sched.live.ask(claim, lambda t: None)], cand, [False]))
        sched._place()
        starts = [m for m in pipe.sent if isinstance(m, Start)]
        assert len(starts) == 2 and len(sched.waiting) == 1  # the third waits for room
        compiled = [sched.notes[m.number]["compiled_batch"] for m in starts]
        assert compiled == [359, 44] == [m.program.batch_size for m in starts]
        assert [sched.notes[m.number]["total_bytes"] for m in starts] == [big, small]
        placed = sum(p.size for p in sched.workers[0].residents.values())
        assert placed <= arena and list(sched.workers[0].free) == [(arena - 64, 64)]
    finally:
        sched.arrays.close()


class _Program:
    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes


class _Candidate:
    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    def fitting(self) -> Any:
        return (_Program(s) for s in self.sizes)


def test_the_least_busy_worker_with_room_then_the_tightest_segment() -> None:
    busy = Worker(0, None, None, free=FreeList([(0, 1024)]))  # type: ignore[arg-type]
    busy.residents[7] = Placement(None, None, 0, 1024, 64, 0.0)  # type: ignore[arg-type]
    idle = Worker(1, None, None, free=FreeList([(0, 512), (640, 128)]))  # type: ignore[arg-type]
    spot = find_spot({0: busy, 1: idle}, _Candidate(100))  # type: ignore[arg-type]
    assert spot is not None and (spot.worker.index, spot.offset, spot.size) == (1, 640, 128)
    # No room for the preferred program anywhere: the largest smaller one that fits.
    spot = find_spot({0: busy, 1: idle}, _Candidate(2048, 1000, 64))  # type: ignore[arg-type]
    assert spot is not None and (spot.worker.index, spot.offset, spot.size) == (0, 0, 1024)
    assert spot.program.total_bytes == 1000
    assert find_spot({1: idle}, _Candidate(4096)) is None  # type: ignore[arg-type]
