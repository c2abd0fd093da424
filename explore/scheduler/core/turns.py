"""Turns: which trial goes on next where the core gives the turns rather than the
pruner alone (lockstep: one trial at a time, depth first; rotation, the budget's
``in_flight``: more trials in hand than the arenas hold, each worker given the next turn,
the one fewest rounds along first)."""

from __future__ import annotations

from typing import Any

from explore.scheduler.commands import Command, Send
from explore.scheduler.core.switching import Switching
from explore.scheduler.placement import Placement, Resuming, Worker
from explore.scheduler.protocol import Continue
from explore.scheduler.stacking import Pending


class Turns(Switching):
    """Decides whose turn it is in lockstep and in rotation, bringing a trial that is
    out back in (or making room for it) when its turn comes."""

    @property
    def turns(self) -> bool:
        """Trials go on in the turns the core gives (lockstep, rotation), not as soon
        as the pruner lets them."""
        return self.lockstep or self.rotation is not None

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
