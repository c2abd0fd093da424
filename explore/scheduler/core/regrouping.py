"""Stacks regrouped: when some member of a stack left, paused or resumed, what it still
holds is moved into new programs beside it once the round's reports are read (the
members going on into one, each paused member into one of its own); a stack that finds
no room goes on with members masked until memory is given back."""

from __future__ import annotations

from engine.alignment import align_up
from explore.scheduler.commands import Moved, Send
from explore.scheduler.core.endings import FOR_ROOM
from explore.scheduler.core.switching import Switching
from explore.scheduler.placement import Stack, Worker
from explore.scheduler.protocol import Part, Regroup


class Regrouping(Switching):
    """Decides when and how a stack is regrouped, and what leaves the arena (or is
    pruned) when its parts do not fit."""

    def _regrouped(self, w: Worker | None, number: int) -> None:
        if w is None:
            return
        st = w.stacks.pop(number, None)
        if st is not None:  # the old stack's region is free in the worker now
            w.free.release(st.offset, st.size)
            self._memory_freed()

    def _regroup(self, w: Worker, st: Stack) -> bool:
        """Move what ``st`` still holds into new programs beside it when some member left
        or is paused: the members going on into one (a smaller stack, or one alone),
        each paused member into one of its own.  True once sent; False when the parts
        do not fit the worker's arena now (``regroup_due``: tried again as memory is
        given back), or when nothing needs moving."""
        if st.regrouping or w.stacks.get(st.number) is not st:
            return False
        placed = {m: w.residents[m] for m in st.members if m in st.held and
                  not w.residents[m].leaving}  # one leaving is not moved
        going = [m for m in st.members if m in placed and placed[m].paused is None]
        paused = [m for m in st.members if m in placed and placed[m].paused is not None]
        if not placed or (not paused and len(going) == len(st.members)) or not going:
            st.regroup_due = False  # all go on, or all wait: the stack stays as it is
            return False
        groups_ = [going] + [[m] for m in paused]
        programs = [self.part(st, g) for g in groups_]
        heaps, room = self.heaps(), self.room()
        taken: list[tuple[int, int]] = []
        for prog in programs:
            size = align_up(prog.total_bytes)
            fit = w.free.best_fit(size)
            if fit is None or heaps + size > room:
                for off, n in taken:
                    w.free.release(off, n)
                return False
            w.free.take(fit[0], size)
            taken.append((fit[0], size))
            heaps += size
        parts = []
        for g, prog, (offset, size) in zip(groups_, programs, taken, strict=True):
            for m in g:  # in the trial's record (written when it ends)
                self._emit(Moved(m, {"models": len(g), "paused": placed[m].paused is not None,
                                     "at": round(self.now, 3)}))
            if len(g) == 1:
                p = placed[g[0]]
                p.stack, p.offset, p.size, p.program = None, offset, size, prog
                parts.append(Part(g[0], prog, offset, tuple(g), p.paused is not None))
                continue
            sub = Stack(self._stack_number(), offset, size, prog, tuple(g),
                        {m: st.graphs[m] for m in g}, {m: st.optimizers[m] for m in g},
                        held=set(g))
            w.stacks[sub.number] = sub
            for m in g:
                placed[m].stack, placed[m].offset, placed[m].program = sub, offset, None
            parts.append(Part(sub.number, prog, offset, tuple(g)))
        st.regrouping, st.regroup_due, st.held = True, False, set()
        self.counts["regrouped"] = self.counts.get("regrouped", 0) + 1
        self._emit(Send(w.index, Regroup(st.number, tuple(parts))))
        return True

    def _regroup_due(self) -> None:
        """Regroup the stacks whose members left or paused, once the reports of a round
        are read (they come together).  A paused member whose heap of its own does not
        fit leaves the arena alone (switched out as a program of its own; pruned only
        where switching is off or at its limit); a stack that only lost members and
        finds no room now goes on with them masked, and is tried again when memory is
        given back."""
        if not self._regroups_waiting:
            return
        self._regroups_waiting = False
        for w in list(self.workers.values()):
            for st in list(w.stacks.values()):
                if not st.regroup_due or self.workers.get(w.index) is not w:
                    continue
                if self._regroup(w, st):
                    continue
                stuck = [w.residents[m] for m in st.members if m in st.held and
                         w.residents[m].paused is not None and not w.residents[m].leaving]
                if stuck and len(stuck) < len(st.held):
                    for p in stuck:  # they cannot wait apart in the arena: they wait
                        # out of it (pruned where they cannot), and the rest go on
                        if self.switching and self._may_leave([p]):
                            self._switch_out(w, p)
                        else:
                            self._prune(w, p, FOR_ROOM, regroup=False)
                    if not self._regroup(w, st) and st.regroup_due:
                        st.regroup_due = False  # masked until memory is given back
                        self._masked.append((w, st))
                elif st.regroup_due:
                    st.regroup_due = False
                    self._masked.append((w, st))
