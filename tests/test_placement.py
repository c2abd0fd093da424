"""The scheduler's placement, without processes: best fit into the workers' free
segments, and a candidate's smaller program (compiled at its training batch) placed
where only it fits."""

from __future__ import annotations

from typing import Any

import optuna

from explore.candidate import compile_candidate
from explore.data import load_digits
from explore.sampling import fixed
from explore.scheduler import Scheduler, Worker
from explore.space import parse_space

SPACE = {"name": "p", "dataset": "digits", "budget": {"trials": 3, "rounds": 1,
                                                      "memory": "64MB", "workers": 1},
         "pruner": "none", "training": {"batch_size": 8}}


class Pipe:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, msg: tuple[Any, ...]) -> None:
        self.sent.append(msg)


def test_a_gap_too_small_for_the_preferred_program_takes_the_smaller_one() -> None:
    space = parse_space(SPACE)
    cand = compile_candidate(space, fixed(space), 10_000_000)
    assert cand.smaller is not None and cand.program.batch_size == 359
    big, small = cand.program.total_bytes, cand.smaller.total_bytes
    assert small < big
    arena = -(-big // 64) * 64 + -(-small // 64) * 64 + 64  # one of each, not two big
    sched = Scheduler(space, optuna.create_study(direction="maximize"), load_digits(),
                      workers=1, memory=space.budget.memory, device="cpu")
    try:
        pipe = Pipe()
        sched.workers = {0: Worker(0, None, pipe, arena=arena,  # type: ignore[arg-type]
                                   free=[[0, arena]])}
        sched.stats.arena = arena
        for _ in range(3):
            sched.waiting.append((sched.study.ask(), cand, False))
        sched._place()
        starts = [m for m in pipe.sent if m[0] == "start"]
        assert len(starts) == 2 and len(sched.waiting) == 1  # the third waits for room
        compiled = [sched.notes[m[1]]["compiled_batch"] for m in starts]
        assert compiled == [359, 8]
        assert [sched.notes[m[1]]["total_bytes"] for m in starts] == [big, small]
        placed = sum(p.size for p in sched.workers[0].residents.values())
        assert placed <= arena and sched.workers[0].free == [[arena - 64, 64]]
    finally:
        sched.arrays.close()
