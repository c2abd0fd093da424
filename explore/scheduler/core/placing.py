"""Placing what waits, in order: stacks waiting to regroup first (they hold their memory
already), then promoted trials switched out, then the candidates waiting, the first
without room having paused trials switched out for it."""

from __future__ import annotations

from explore.scheduler.commands import Command, Measure
from explore.scheduler.core.regrouping import Regrouping
from explore.scheduler.core.turns import Turns
from explore.scheduler.stacking import Pending

AHEAD_PER_WORKER = 4  # trials drawn ahead at most, per worker of the run


def ahead(blind: int | None, claimed: int, workers: int, unclaimed: int) -> int:
    """How many trials the scheduler draws before it starts any of them, when it holds
    none drawn ahead: the rest of the sampler's ``blind`` draws (its first trials, which
    read no result: :meth:`explore.samplers.BaseSampler.blind`; None: all of them) once
    the study's ``claimed`` trials are taken, at most :data:`AHEAD_PER_WORKER` per
    worker and no more than its share of the study's ``unclaimed`` trials (the last
    ones are left to the other workers and drivers); 1 (draw and start) once none is
    left.

    Such a trial is the same whenever it is drawn, so drawing it early costs the search
    nothing, and the compiler's count of each one's FLOPs lets the run start the cheapest
    first (:meth:`Placing.release`).  The next draw ahead waits until all of these have
    started, so a costly trial is put off by one draw at most.

    >>> ahead(10, 0, 2, 60), ahead(10, 8, 2, 52), ahead(10, 12, 2, 48)
    (8, 2, 1)
    >>> ahead(None, 500, 2, 500), ahead(None, 500, 2, 5)
    (8, 3)
    """
    w = max(1, workers)
    most = min(AHEAD_PER_WORKER * w, -(-unclaimed // w))
    left = most if blind is None else blind - claimed
    return max(1, min(left, most))


def cost(pend: Pending) -> int:
    """The FLOPs a round of ``pend`` takes, its models together: what
    :meth:`Placing.release` orders the candidates drawn ahead by."""
    train, valid = pend.candidate.round_flops
    return (train + valid) * len(pend.trials)


class Placing(Turns, Regrouping):
    """Decides the order in which what waits is placed (:meth:`place`)."""

    def draw_size(self, blind: int | None, claimed: int, workers: int, unclaimed: int
                  ) -> int:
        """How many trials the loop's next draw takes (:func:`ahead`'s arguments): 1 in
        lockstep or rotation, which ask one at a time, and with a timeout, as what was
        drawn ahead when it passed would either run past it or end failed and queued
        again, where a run asked one at a time ends with every trial it began complete."""
        if self.lockstep or self.rotation is not None or self.timeout is not None:
            return 1
        return ahead(blind, claimed, workers, unclaimed)

    def release(self) -> bool:
        """Move the cheapest candidate drawn ahead (:attr:`ahead`, by :func:`cost`; the
        first drawn of equals) to those waiting to be placed; False when none is held.

        The loop calls it where it would ask for a candidate, so that of the trials a
        sampler drew blind the cheapest give their results first: the first accuracy a
        user sees, the first values the pruner compares, come after the shortest
        trials, and the work of the search is the same."""
        if not self.ahead:
            return False
        first = min(self.ahead, key=cost)
        self.ahead.remove(first)
        self.waiting.append(first)
        return True

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
