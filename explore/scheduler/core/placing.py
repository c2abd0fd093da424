"""Placing what waits, in order: stacks waiting to regroup first (they hold their memory
already), then promoted trials switched out, then the candidates waiting, the first
without room having paused trials switched out for it."""

from __future__ import annotations

from explore.scheduler.commands import Command, Measure
from explore.scheduler.core.regrouping import Regrouping
from explore.scheduler.core.turns import Turns
from explore.scheduler.stacking import Pending


class Placing(Turns, Regrouping):
    """Decides the order in which what waits is placed (:meth:`place`)."""

    def place(self) -> list[Command]:
        """Put waiting candidates where they fit (the least busy worker with room, best
        fit in its arena); stacks waiting to regroup first, as they hold their memory
        already, then promoted trials switched out (lockstep: in their turn, :meth:`go`).
        The first that finds no room has paused trials switched out for it
        (:meth:`_make_room`), and those behind it wait until it is placed; where no
        room can be made now, others that fit a gap go on being placed."""
        self._regroup_due()
        if self.rotation is not None:
            self._rotate()
            self._emit(Measure())
            return self.take()
        if not self.lockstep and not self._bring_back():
            self._emit(Measure())
            return self.take()  # a promoted trial waits for room: it goes first
        still: list[Pending] = []
        batch, self.waiting = self.waiting, []
        heaps = self.heaps()
        making = False  # room is being made for the first that found none
        for pend in batch:
            if making:  # those behind it wait: they would take what it is made for
                still.append(pend)
                continue
            cand = pend.candidate
            spot, grown = self._spot(self.workers, cand, heaps)
            if grown:
                self._fail_unstarted(pend, grown)
                continue
            if spot is None:
                if not still and self.switching:  # the first without room: paused trials
                    # make it some
                    making = self._make_room_for(cand)
                still.append(pend)
                continue
            heaps += spot.size
            self._launch(pend, spot)
            if self.lockstep:
                self.in_flight = pend.trials[0].number
        self.waiting = still + self.waiting
        self._emit(Measure())
        return self.take()
