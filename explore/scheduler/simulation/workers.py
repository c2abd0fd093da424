"""The simulated workers' side of :class:`~explore.scheduler.simulation.Simulation`: what
a worker does with each message the core sends it (as :mod:`explore.scheduler.worker`
does), and a round run.  A worker keeps each resident's region of its arena and a
switched-out trial's state in a simulated file (the simulation's ``store``), so what
the core decides is checked against what the workers would hold: no region
overwritten, no state read that was not written, no round lost or run twice across
switches.  What a worker answers goes to the simulation's ``outbox``, for the core.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from engine.alignment import align_up
from explore.scheduler.protocol import (
    Continue,
    Done,
    Pause,
    Regroup,
    Report,
    Stop,
    SwitchedOut,
    SwitchIn,
    SwitchOut,
    TrialFailed,
)
from explore.scheduler.simulated import SimRegrouped, SimResident, SimStart, SimWorker
from explore.scheduler.simulation.invariants import Invariants, Violation


class SimulatedWorkers(Invariants):
    """The workers' part of :class:`~explore.scheduler.simulation.Simulation`: the state
    it reads is the simulation's (set in its ``__init__``), every random choice from
    its ``rng``, so that a seed replays the same schedule."""

    rng: random.Random
    rounds: int
    gated: bool
    now: float
    outbox: deque[tuple[int, Any]]
    reported: dict[int, int]

    def _receive(self, sw: SimWorker) -> None:
        msg = sw.inbox.popleft()
        if isinstance(msg, SimStart):
            self._region_free(sw, msg.offset, msg.size, f"trial {msg.number}'s start")
            r = SimResident(msg.number, list(msg.members), self.rounds, self.gated,
                            live=set(msg.members), region=(msg.offset, msg.size))
            sw.residents[msg.number] = r
            for m in msg.members:
                sw.owner[m] = msg.number
        elif isinstance(msg, Continue | Pause):
            if msg.number in sw.owner:
                sw.residents[sw.owner[msg.number]].word(msg.number, isinstance(msg, Continue))
        elif isinstance(msg, Stop):
            if msg.number in sw.owner:
                r = sw.residents[sw.owner[msg.number]]
                r.word(msg.number, None)
                if not r.live:
                    self._drop(sw, r.number)
        elif isinstance(msg, Regroup):
            old = sw.residents.get(msg.number)
            if old is not None:
                for part in msg.parts:
                    size = align_up(part.program.total_bytes)
                    self._region_free(sw, part.offset, size, f"part {part.number}")
                    r = SimResident(part.number, list(part.members), old.rounds, old.gated,
                                    old.round, set(part.members) & old.live,
                                    old.waiting & set(part.members),
                                    set(part.members) if part.paused else set(),
                                    (part.offset, size))
                    sw.residents[part.number] = r
                for m in old.members:
                    sw.owner.pop(m, None)
                for part in msg.parts:
                    for m in part.members:
                        sw.owner[m] = part.number
                sw.residents.pop(msg.number)
            self.outbox.append((sw.index, SimRegrouped(msg.number)))
        elif isinstance(msg, SwitchOut):
            self._switch_out(sw, msg)
        elif isinstance(msg, SwitchIn):
            self._switch_in(sw, msg)

    def _switch_out(self, sw: SimWorker, msg: SwitchOut) -> None:
        """Write the trial's state to its simulated file and give its region back (or
        fail to write it, as a full disk would)."""
        n = msg.number
        r = sw.residents.get(sw.owner.get(n, n))
        if r is None or n not in r.live:
            raise Violation(self._where(f"trial {n} switched out, but worker {sw.index} "
                                        "does not hold it"))
        if r.members != [n]:  # a stack's member leaves alone: masked there, as stopped
            if n not in r.held:
                raise Violation(self._where(f"stacked trial {n} switched out while it "
                                            "could run"))
            r.word(n, None)
            sw.owner.pop(n, None)
            if not r.live:
                self._drop(sw, r.number)
            r = SimResident(n, [n], r.rounds, r.gated, r.round, {n},
                            region=(0, align_up(msg.program.total_bytes)))
        elif r.runnable():
            raise Violation(self._where(f"trial {n} switched out while it could run"))
        else:
            self._drop(sw, n)
        if self.rng.random() < 0.03:
            self.outbox.append((sw.index, TrialFailed(n, "could not be switched out: "
                                                         "simulated")))
            return
        self.store[n] = r
        self.outbox.append((sw.index, SwitchedOut(n, r.region[1], 0.0)))

    def _switch_in(self, sw: SimWorker, msg: SwitchIn) -> None:
        """Read the trial's state back into its new region: it waits for its word."""
        r = self.store.pop(msg.number, None)
        if r is None:
            raise Violation(self._where(f"trial {msg.number} switched in, but its state "
                                        "was never written"))
        size = align_up(msg.program.total_bytes)
        self._region_free(sw, msg.offset, size, f"trial {msg.number}'s switch in")
        r.region, r.waiting, r.held = (msg.offset, size), {msg.number}, set()
        sw.residents[msg.number] = r
        sw.owner[msg.number] = msg.number

    def _region_free(self, sw: SimWorker, offset: int, size: int, what: str) -> None:
        held = sw.overlaps(offset, size)
        if held is not None:
            raise Violation(self._where(f"{what} at [{offset}, {offset + size}) of worker "
                                        f"{sw.index} overwrites {held}, still there"))

    def _drop(self, sw: SimWorker, number: int) -> None:
        r = sw.residents.pop(number, None)
        if r is not None:
            for m in r.members:
                if sw.owner.get(m) == number:
                    del sw.owner[m]

    def _run_round(self, sw: SimWorker, r: SimResident) -> None:
        live = sorted(r.live)
        for m in live:  # the core's view: what runs is not paused
            p = self.core.workers[sw.index].residents.get(m)
            if p is not None and p.paused is not None:
                raise Violation(self._where(f"trial {m} runs while paused at rung "
                                            f"{p.paused}"))
        r.round += 1
        for m in live:  # a switch (or a regroup) loses no round and repeats none
            if self.reported.get(m, 0) + 1 != r.round:
                raise Violation(self._where(f"trial {m} ran round {r.round} after round "
                                            f"{self.reported.get(m, 0)}"))
            self.reported[m] = r.round
        if self.rng.random() < 0.03:  # a trial's loss diverges, or its code raises
            m = self.rng.choice(live)
            self.outbox.append((sw.index, TrialFailed(m, "diverged: simulated")))
            r.word(m, None)
            live.remove(m)
        if r.round >= r.rounds or not live:
            self._drop(sw, r.number)
            for m in live:
                self.outbox.append((sw.index, Done(m, {"score": self._score(m)}, r.round,
                                                   0, 0.0, self.now, self.now)))
            return
        if r.gated:
            r.waiting = set(live)
        for m in live:
            self.outbox.append((sw.index, Report(m, r.round, {"score": self._score(m)},
                                                 self.now)))

    def _score(self, number: int) -> float:
        return random.Random(self.seed * 7_919 + number).random()
