"""The simulated world of :mod:`.simulation`: trials, candidates and programs as the
core sees them, a pruner drawn from the seed, and workers that run what they are sent
(as :mod:`explore.scheduler.worker` does: rounds, reports, the word after a report, stacks held
at a rung until regrouped, trials switched out to a simulated file and back).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from explore.scheduler.policy import PRUNE, Verdict
from explore.scheduler.protocol import ToWorker


@dataclass(frozen=True)
class SimTrial:
    number: int


@dataclass(frozen=True)
class SimProgram:
    total_bytes: int
    zone_bytes: tuple[int, ...] = ()
    batch_size: int = 1


@dataclass
class SimCandidate:
    """A compiled candidate: its programs, the preferred first (smaller validation
    chunks after it, as :meth:`explore.candidate.Candidate.fitting` gives them)."""

    sizes: tuple[int, ...]
    train_batch: int = 1
    round_flops: tuple[int, int] = (0, 0)

    @property
    def heap_bytes(self) -> int:
        return self.sizes[0]

    def fitting(self) -> Any:
        return (SimProgram(s) for s in self.sizes)


class SimPolicy:
    """A rung pruner of its own, drawn from the seed: a report prunes, pauses at the
    rung (gated) or goes on; a paused trial is promoted once it ranks in the top
    ``1/eta`` of the trials that reached its rung."""

    def __init__(self, seed: int, gated: bool, eta: int = 3) -> None:
        self.seed, self.gated, self.eta = seed, gated, eta
        self.scores: dict[int, dict[int, float]] = {}  # rung -> trial -> score
        self.steps: dict[int, int] = {}
        self.said: dict[int, Verdict] = {}  # each trial's last verdict

    def _draw(self, number: int, round: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + number * 1_009 + round)

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Verdict:
        self.steps[trial.number] = round
        self.scores.setdefault(round, {})[trial.number] = measured["score"]
        r = self._draw(trial.number, round).random()
        verdict: Verdict = PRUNE if r < 0.15 else round if self.gated and r < 0.45 else None
        self.said[trial.number] = verdict
        return verdict

    def promotable(self, trial: Any, rung: int) -> bool:
        at = self.scores.get(rung, {})
        top = sorted(at, key=lambda n: -at[n])[:len(at) // self.eta]
        return trial.number in top

    def standing(self, trial: Any, rung: int) -> float:
        at = self.scores.get(rung, {})
        mine = at.get(trial.number, 0.0)
        return sum(v > mine for v in at.values()) / max(len(at), 1)

    def last_step(self, trial: Any) -> int | None:
        return self.steps.get(trial.number)

    def values(self, measured: dict[str, float], heap: int) -> list[float]:
        return [measured["score"]]

    def best(self, a: float | None, b: float) -> float:
        return b if a is None else max(a, b)


@dataclass
class SimResident:
    """What a simulated worker runs: a trial alone or a stack (as explore.scheduler.worker's
    Resident: members live, waiting for their word, held at a rung)."""

    number: int
    members: list[int]
    rounds: int
    gated: bool
    round: int = 0
    live: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    region: tuple[int, int] = (0, 0)  # (offset, bytes) of the arena

    def runnable(self) -> bool:
        return bool(self.live) and not self.waiting and not self.held

    def word(self, member: int, go: bool | None) -> None:
        self.waiting.discard(member)
        self.held.discard(member)
        if go is None:
            self.live.discard(member)
        elif not go:
            self.held.add(member)


@dataclass
class SimWorker:
    """A worker process as the core cannot see it: its inbox and what it runs."""

    index: int
    inbox: deque[ToWorker] = field(default_factory=deque)
    residents: dict[int, SimResident] = field(default_factory=dict)
    owner: dict[int, int] = field(default_factory=dict)
    alive: bool = True

    def overlaps(self, offset: int, size: int) -> int | None:
        """The resident whose region ``[offset, offset + size)`` would overwrite."""
        for r in self.residents.values():
            o, n = r.region
            if offset < o + n and o < offset + size:
                return r.number
        return None


@dataclass(frozen=True)
class SimStart:
    """A Launch as the simulated worker receives it."""

    number: int
    members: list[int]
    offset: int = 0
    size: int = 0


@dataclass(frozen=True)
class SimRegrouped:
    number: int
