"""The scheduler's placement, without processes: best fit into the workers' free
segments, and the largest of a candidate's smaller programs (compiled for smaller
validation chunks) placed where only it fits."""

from __future__ import annotations

from typing import Any

from engine.free_list import FreeList
from explore.binding import bind
from explore.candidate import compile_candidate
from explore.sampling import fixed
from explore.scheduler.commands import Admitted, Launch
from explore.scheduler.core import Core
from explore.scheduler.placement import Placement, Worker, find_spot
from explore.scheduler.simulated import SimPolicy, SimTrial
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats
from explore.space import parse_space

SPACE = {"name": "p", "dataset": "digits", "budget": {"trials": 3, "rounds": 1,
                                                      "memory": "64MB", "workers": 1},
         "pruner": "none", "training": {"batch_size": 8}}


def test_a_gap_too_small_for_the_preferred_program_takes_the_largest_that_fits() -> None:
    space = parse_space(SPACE)
    cand = compile_candidate(bind(space), fixed(space), 10_000_000)
    assert cand.program.batch_size == 359 and cand.fallback_batches == (179, 89, 44, 22, 11, 8)
    sizes = {p.batch_size: p.total_bytes for p in cand.fitting()}
    assert [sizes[b] for b in (359, 179, 89, 44, 22, 11, 8)] == sorted(sizes.values())[::-1]
    big, small = sizes[359], sizes[44]
    # One of each, not two big: a gap of 44 rows' program (and less than 89 rows').
    arena = -(-big // 64) * 64 + -(-small // 64) * 64 + 64
    core = Core(SimPolicy(0, gated=False), RunStats(arena))
    core.add_worker(Worker(0, None, None, arena=arena,  # type: ignore[arg-type]
                           free=FreeList([(0, arena)])))
    for n in range(3):
        core.handle(Admitted(Pending([SimTrial(n)], cand, [False])))
    launched = [c for c in core.place() if isinstance(c, Launch)]
    assert len(launched) == 2 and len(core.waiting) == 1  # the third waits for room
    assert [c.program.batch_size for c in launched] == [359, 44]
    assert [c.program.total_bytes for c in launched] == [big, small]
    placed = sum(p.size for p in core.workers[0].residents.values())
    assert placed <= arena and list(core.workers[0].free) == [(arena - 64, 64)]


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
