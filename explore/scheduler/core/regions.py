"""Regions of the arenas taken and given back, in the core's mirror of them: where a
program fits within the room the budget leaves, a candidate launched into its region (a
stack's trials sharing one), a launch undone, and a trial's region given back as it
leaves its worker (a stack's once its last member leaves; until then the others are
due to be regrouped without it)."""

from __future__ import annotations

from typing import Any

from explore.scheduler.commands import Launch
from explore.scheduler.core.state import CoreState
from explore.scheduler.placement import Placement, Spot, Stack, Worker, find_spot
from explore.scheduler.stacking import Pending


class Regions(CoreState):
    """Decides where a program goes (the least busy worker with room, best fit in its
    arena, within the room the budget leaves) and keeps the mirror's free lists as
    regions are taken and given back."""

    def _launch(self, pend: Pending, spot: Spot) -> None:
        """Start ``pend`` at ``spot``: its region taken, its trials (a stack's too) held."""
        w, cand = spot.worker, pend.candidate
        w.free.take(spot.offset, spot.size)
        stack = None
        if pend.stacked:
            numbers = tuple(t.number for t in pend.trials)
            stack = Stack(self._stack_number(), spot.offset, spot.size, spot.program,
                          numbers, dict(zip(numbers, pend.graphs, strict=True)),
                          dict(zip(numbers, pend.optimizers, strict=True)),
                          held=set(numbers))
            w.stacks[stack.number] = stack
        for trial, requeued in zip(pend.trials, pend.requeued, strict=True):
            w.residents[trial.number] = Placement(
                trial, cand, w.index, spot.offset, 0 if stack else spot.size, self.now,
                requeued, stack=stack, program=None if stack else spot.program)
        self._emit(Launch(w.index, pend, spot.offset, spot.program, stack))

    def _spot(self, workers: dict[int, Worker], cand: Any,
              heaps: int) -> tuple[Spot | None, int]:
        """Where ``cand`` goes in ``workers`` within the room the budget leaves beside
        ``heaps`` placed: (its spot, 0); (None, 0) while it waits; (None, its bytes)
        when it could not fit even with none placed, as the processes grew beyond their
        measured constants (they take room from the heaps): it fails, saying so."""
        spot = find_spot(workers, cand, most=self.room() - heaps)
        if spot is None and heaps == 0:
            grown = find_spot(workers, cand)
            if grown is not None:
                return None, grown.size
        return spot, 0

    def unplace(self, worker: int, pending: Pending, stack: Stack | None,
                offset: int, size: int) -> None:
        """A launch that never reached its worker (the worker died first): the candidate
        waits again, for another worker."""
        w = self.workers.get(worker)
        if w is not None:
            for t in pending.trials:
                w.residents.pop(t.number, None)
            if stack is not None:
                w.stacks.pop(stack.number, None)
            w.free.release(offset, size)
        self.waiting.append(pending)

    def _release(self, w: Worker, p: Placement, regroup: bool = True) -> None:
        """The trial leaves its worker: its region is free, or, for a member of a stack,
        the stack's once no member is left there (until then, with ``regroup``, the
        others are stacked again without it)."""
        w.residents.pop(p.trial.number, None)
        st = p.stack
        if st is None:
            w.free.release(p.offset, p.size)
            self._memory_freed()
            return
        st.held.discard(p.trial.number)
        if st.held:
            if regroup:
                self._stack_changed(p)
        elif not st.regrouping and w.stacks.get(st.number) is st:
            del w.stacks[st.number]
            w.free.release(st.offset, st.size)
            self._memory_freed()

    def _stack_changed(self, p: Placement) -> None:
        """A member of ``p``'s stack left, paused or resumed: regroup it once the
        round's reports are read (:meth:`_regroup_due`)."""
        if p.stack is not None and p.stack.held:
            p.stack.regroup_due = True
            self._regroups_waiting = True

    def _memory_freed(self) -> None:
        """Memory was given back: stacks that found no room to regroup try again."""
        for _, st in self._masked:
            st.regroup_due = True
            self._regroups_waiting = True
        self._masked.clear()
