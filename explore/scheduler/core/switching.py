"""Making room by switching paused trials out of their arenas (their states written to
files), and bringing promoted ones back in.

Which trials leave (:meth:`Switching._make_room`): those idle in a worker, the lowest
standing at its rung first, in the arena where the fewest must leave, until the one
waiting fits; within the switch limit.  A region is free in the mirror only once the
worker says the state is written (:meth:`Switching._left`)."""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.free_list import FreeList
from explore.scheduler.commands import Measure, Send
from explore.scheduler.core.endings import FOR_ROOM, Endings
from explore.scheduler.placement import Placement, Resuming, Spot, Worker, state_size
from explore.scheduler.protocol import Continue, SwitchedOut, SwitchIn, SwitchOut


class Switching(Endings):
    """Decides which trials leave an arena for a file when room is needed, and when a
    promoted trial that is out comes back in (into any arena with room)."""

    def out_bytes(self) -> int:
        """Bytes of switched-out states: those written (as their workers said) and
        those on their way (as :func:`~.placement.state_size` expects)."""
        return sum(p.state for p in self.out.values()) + \
            sum(state_size(p.program) for w in self.workers.values()
                for p in w.residents.values() if p.leaving)

    def _state_of(self, p: Placement) -> int:
        """The bytes ``p``'s state would take out (a stack's member: as the program of
        its own it would leave as)."""
        if p.stack is not None and p.program is None:
            p.program = self.part(p.stack, [p.trial.number])  # kept for its SwitchOut
        return state_size(p.program)

    def _may_leave(self, victims: list[Placement]) -> bool:
        """Whether the states of ``victims`` fit the switch limit beside those out."""
        return self.switch_limit is None or \
            self.out_bytes() + sum(map(self._state_of, victims)) <= \
            self.switch_limit

    def _idle_on(self, w: Worker) -> list[Placement]:
        """The trials of ``w`` that could leave its arena now, in the order they would:
        alone (a stack's member cannot yet) and idle in the worker: paused at a rung,
        or, in lockstep, waiting for their turn (nothing runs between two turns)."""
        ready = {id(q) for q in self.ready}
        idle = [p for p in w.residents.values()
                if not p.leaving and (
                    (p.stack is None and p.program is not None and
                     (p.paused is not None or (id(p) in ready and not self._runs(p)))) or
                    (p.stack is not None and p.paused is not None and
                     not p.stack.regrouping))]
        return sorted(idle, key=self._leave_order)

    def _leave_order(self, p: Placement) -> tuple[bool, float, int]:
        """Paused trials before those about to run; among them the one standing lowest
        at its rung (the least likely to be promoted soon), then the one paused longest.
        In rotation, of those about to run, the one whose turn is furthest away."""
        if p.paused is None:
            if self.rotation is not None:
                return True, -float(p.rounds), -p.trial.number
            return True, 0.0, p.trial.number
        return False, -self.policy.standing(p.trial, p.paused), p.trial.number

    def _make_room(self, size: int, among: dict[int, Worker] | None = None) -> bool:
        """Switch out paused trials until some arena has a free segment of ``size``
        bytes within the room the budget leaves: in the worker where the fewest must
        leave (then the least busy), taken the lowest standing first, then any that
        turn out not to be needed (a neighbour's region was enough) staying; regions
        already on their way out count as free.  False when no single arena can make
        the room (its trials run, or the processes grew): the one waiting waits.
        ``among``: the workers it may be made in (default: all)."""
        heaps, room = self.heaps(), self.room()
        on_way = {id(p) for w in self.workers.values() for p in w.residents.values()
                  if p.leaving}
        leaving = sum(n for w in self.workers.values() for _, n in _released(w, on_way))

        def fits(w: Worker, victims: list[Placement]) -> bool:
            free = FreeList(list(w.free))
            regions = _released(w, on_way | {id(p) for p in victims})
            for offset, n in regions:
                free.release(offset, n)
            more = sum(n for _, n in regions) - sum(n for _, n in _released(w, on_way))
            return free.best_fit(size) is not None and self._may_leave(victims) and \
                heaps - leaving - more + size <= room

        best: tuple[tuple[int, int, int], Worker, list[Placement]] | None = None
        for w in (self.workers if among is None else among).values():
            victims: list[Placement] = []
            if not fits(w, victims):  # regions on their way out often are enough
                for p in self._idle_on(w):
                    victims.append(p)
                    if fits(w, victims):
                        break
                else:
                    continue
                # any the room is made without stays, the best standing first
                for p in reversed(victims[:-1]):
                    rest = [q for q in victims if q is not p]
                    if fits(w, rest):
                        victims = rest
            key = (len(victims), w.active(), w.index)
            if best is None or key < best[0]:
                best = (key, w, victims)
        if best is None:
            return False
        for p in best[2]:
            self._switch_out(best[1], p)
        return True

    def _make_room_for(self, cand: Any, among: dict[int, Worker] | None = None) -> bool:
        """:meth:`_make_room` for the first of ``cand``'s programs (the preferred, then
        the smaller ones) it can be made for."""
        return any(self._make_room(align_up(prog.total_bytes), among)
                   for prog in cand.fitting())

    def _make_way(self) -> None:
        """Room for what waits that no single arena could make (:meth:`_make_room`)
        while nothing runs: every idle trial leaves, so that the one waiting fits or,
        with nothing placed, fails saying why; a stack's paused member cannot leave
        alone yet, so the one of them paused longest is pruned instead, as is the one
        paused longest when the switch limit lets none leave."""
        left = False
        for w in self.workers.values():
            for p in self._idle_on(w):
                if self._may_leave([p]):
                    self._switch_out(w, p)
                    left = True
        if left:
            return
        if self.switch_limit is not None:  # none may leave: the one paused longest ends
            for held, p in self.paused():
                if held is not None:
                    self._prune(held, p, FOR_ROOM)
                    return

    def _switch_out(self, w: Worker, p: Placement) -> None:
        """``p`` leaves the arena; a stack's member as a program of its own (compiled as
        a regroup would), which its state is written in and it comes back as."""
        p.leaving = True
        if p.stack is not None and p.program is None:
            p.program = self.part(p.stack, [p.trial.number])
        self._emit(Send(w.index, SwitchOut(p.trial.number,
                                           p.program if p.stack is not None else None)))

    def _left(self, w: Worker | None, msg: SwitchedOut) -> None:
        """The worker wrote the trial's state and gave its region back: the region is
        free here too, and the trial is out."""
        p = None if w is None else w.residents.get(msg.number)
        if w is None or p is None or not p.leaving:
            return
        if p.stack is not None:  # the stack goes on without it (regrouped, or masked)
            self._release(w, p)
            p.stack, p.offset, p.size = None, 0, align_up(p.program.total_bytes)
        else:
            del w.residents[msg.number]
            w.free.release(p.offset, p.size)
        if msg.overhead:
            w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        p.leaving, p.moved = False, p.moved + msg.nbytes
        p.state = msg.nbytes
        p.spans.append([self.now])
        self.out[msg.number] = p
        self.counts["switched_out"] = self.counts.get("switched_out", 0) + 1
        self.stats.switch_bytes += msg.nbytes
        self._memory_freed()
        self._emit(Measure())

    def _bring_in(self, p: Placement) -> bool | None:
        """Switch the promoted trial ``p`` back into the arena with room (as a candidate
        is placed), or make room for it: True once sent, False while it waits, None
        when it cannot fit with nothing placed (the processes grew: it fails)."""
        spot, grown = self._spot(self.workers, Resuming(p.program), self.heaps())
        if grown:
            self._fail_out(p, grown)
            return None
        if spot is None:
            self._make_room(align_up(p.program.total_bytes))
            return False
        self._switch_in(p, spot)
        return True

    def _switch_in(self, p: Placement, spot: Spot) -> None:
        """Bring the switched-out ``p`` back into the arena at ``spot``."""
        n, w = p.trial.number, spot.worker
        w.free.take(spot.offset, spot.size)
        del self.out[n]
        p.state = 0  # read back: the worker removes the file
        p.worker, p.offset, p.size = w.index, spot.offset, spot.size
        w.residents[n] = p
        p.spans[-1].append(self.now)
        self._emit(Send(w.index, SwitchIn(n, p.program, spot.offset)))
        self.counts["switched_in"] = self.counts.get("switched_in", 0) + 1

    def _bring_back(self) -> bool:
        """Switch promoted trials back in, oldest first, each continued once in; False
        while one waits for room (new candidates wait behind it)."""
        for p in sorted((p for p in self.out.values() if p.paused is None),
                        key=lambda p: p.trial.number):
            got = self._bring_in(p)
            if got is False:
                return False
            if got:
                self._emit(Send(p.worker, Continue(p.trial.number)))
        return True


def _released(w: Worker, gone: set[int]) -> list[tuple[int, int]]:
    """The regions of ``w``'s arena given back once the trials ``gone`` (their
    Placements' ids) leave: each one alone, and each stack whose members held there
    all leave."""
    regions = [(p.offset, p.size) for p in w.residents.values()
               if id(p) in gone and p.stack is None]
    regions += [(st.offset, st.size) for st in w.stacks.values()
                if st.held and not st.regrouping and
                all(id(w.residents[m]) in gone for m in st.held)]
    return regions
