"""Rotation (the budget's ``in_flight``): more trials in hand than the arenas hold,
advanced round by round, switched out of the arenas and back in turn, on the core
alone (:meth:`explore.scheduler.core.Core._rotate`): a small world plays the workers,
running one round at a time of what the core starts or continues."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from optuna.trial import TrialState

from engine.free_list import FreeList
from explore.scheduler.commands import (
    Admitted,
    Finished,
    Launch,
    LeftArena,
    Reported,
    Send,
    Tell,
)
from explore.scheduler.core import Core
from explore.scheduler.placement import Worker
from explore.scheduler.protocol import Continue, Done, Report, SwitchedOut, SwitchIn, SwitchOut
from explore.scheduler.simulated import SimCandidate, SimPolicy, SimTrial
from explore.scheduler.stacking import Pending
from explore.scheduler.telemetry import RunStats

ARENA = 16_384
SIZE = ARENA // 8  # each trial's heap: an arena holds 8


class GoesOn(SimPolicy):
    """A pruner that lets every trial go on."""

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> None:
        self.steps[trial.number] = round


class Rotation:
    """``trials`` admitted at once (all in flight) into ``workers`` arenas of ARENA
    bytes, each run for ``rounds`` rounds by a world that runs the rounds the core
    asks for, one per worker at a time, and answers a switch out at once."""

    def __init__(self, workers: int, trials: int = 40, rounds: int = 3) -> None:
        self.rounds = rounds
        self.core = Core(GoesOn(0, gated=False), RunStats(ARENA * workers),
                         rotation=trials)
        for i in range(workers):
            self.core.add_worker(Worker(i, None, None, arena=ARENA,  # type: ignore[arg-type]
                                        free=FreeList([(0, ARENA)])))
        self.to_run: dict[int, deque[int]] = {i: deque() for i in range(workers)}
        self.done: dict[int, int] = {}  # rounds each trial has run
        self.order: list[tuple[int, int]] = []  # (trial, round) as the rounds ran
        self.told: dict[int, TrialState | None] = {}
        self.outs = self.ins = 0
        self.events: deque[Any] = deque()
        for n in range(trials):
            self.carry(self.core.handle(Admitted(Pending(
                [SimTrial(n)], SimCandidate((SIZE,)), [False], [None], [None]))))
        self.carry(self.core.place())

    def carry(self, commands: list[Any]) -> None:
        assert self.core.heaps() <= ARENA * len(self.to_run), "beyond the budget"
        for c in commands:
            if isinstance(c, Launch):
                self.to_run[c.worker].append(c.pending.trials[0].number)
            elif isinstance(c, Send) and isinstance(c.msg, Continue):
                self.to_run[c.worker].append(c.msg.number)
            elif isinstance(c, Send) and isinstance(c.msg, SwitchOut):
                self.outs += 1
                self.events.append(LeftArena(c.worker, SwitchedOut(c.msg.number, SIZE, 0.0)))
            elif isinstance(c, Send) and isinstance(c.msg, SwitchIn):
                self.ins += 1
            elif isinstance(c, Tell):
                self.told[c.trial.number] = c.state
        for queue in self.to_run.values():
            assert len(queue) <= 1, "a worker was given two trials to run at once"

    def play(self) -> None:
        for _ in range(100_000):
            if self.events:
                self.carry(self.core.handle(self.events.popleft()))
            else:
                busy = [i for i, q in self.to_run.items() if q]
                if not busy:
                    break
                i = busy[len(self.order) % len(busy)]  # the workers take turns
                n = self.to_run[i].popleft()
                r = self.done[n] = self.done.get(n, 0) + 1
                self.order.append((n, r))
                if r == self.rounds:
                    self.carry(self.core.handle(Finished(i, Done(
                        n, {"score": 0.5}, r, 0, 0.0, 0.0, 0.0))))
                else:
                    self.carry(self.core.handle(Reported(i, Report(
                        n, r, {"score": 0.5}, 0.0))))
            self.carry(self.core.go())
            self.carry(self.core.place())
        assert not self.core.holds(), "trials held at the end"


@pytest.mark.parametrize("workers", [1, 2])
def test_forty_trials_in_flight_in_arenas_that_hold_eight_advance_round_by_round(
        workers: int) -> None:
    world = Rotation(workers, trials=40, rounds=3)
    world.play()
    assert world.told == dict.fromkeys(range(40))  # each completed (told with no state)
    assert world.done == dict.fromkeys(range(40), 3)
    rounds = [r for _, r in world.order]
    if workers == 1:  # strictly: every trial's round r before any trial's round r + 1
        assert rounds == sorted(rounds)
        assert [n for n, r in world.order if r == 1] == list(range(40))
    else:  # each worker's turn goes to the one fewest rounds along that it can take
        done: dict[int, int] = {}
        for n, r in world.order:
            done[n] = r
            assert r - min(done.get(m, 0) for m in range(40)) <= 1, (n, r)
    # the arenas hold 16 of the 40 (8 each): the rest wait their turn switched out,
    # every round after the first
    held = 8 * workers
    assert world.outs >= (40 - held) * 2 and world.ins == world.outs
    assert world.core.counts["switched_out"] == world.outs


def test_a_candidate_takes_its_turn_before_trials_further_along() -> None:
    """A candidate admitted later (0 rounds) goes first: the trials ahead of it wait,
    and one of them leaves the arena for it if it needs the room."""
    world = Rotation(1, trials=8, rounds=3)
    world.core.rotation = 9
    for _ in range(8):  # the first round of the eight
        n = world.to_run[0].popleft()
        world.done[n] = 1
        world.carry(world.core.handle(Reported(0, Report(n, 1, {"score": 0.5}, 0.0))))
        world.carry(world.core.go())
    assert world.to_run[0] == deque([0])  # the arena is full: trial 0 goes on
    world.carry(world.core.handle(Admitted(Pending([SimTrial(8)], SimCandidate((SIZE,)),
                                                   [False], [None], [None]))))
    world.carry(world.core.place())
    assert world.core.waiting  # trial 0 runs: the candidate waits for the worker
    world.to_run[0].popleft()
    world.carry(world.core.handle(Reported(0, Report(0, 2, {"score": 0.5}, 0.0))))
    world.carry(world.core.place())
    # trial 0 (2 rounds done, the furthest along) leaves for it; once out, 8 starts
    assert [type(e) for e in world.events] == [LeftArena] and world.events[0].msg.number == 0
    world.carry(world.core.handle(world.events.popleft()))
    world.carry(world.core.place())
    assert world.to_run[0] == deque([8])
