"""What a run holds, and what is read of it: the settings, the workers and their
arenas (mirrored as free lists), the candidates waiting, the trials switched out, the
turns under way, the commands decided and not yet taken; the room the budget leaves and
the bytes placed in it; the run's counts and its workers' seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from explore.scheduler.commands import Command
from explore.scheduler.placement import Placement, Stack, Worker
from explore.scheduler.policy import Policy
from explore.scheduler.stacking import Pending, part_program
from explore.scheduler.telemetry import RunStats


class CoreState:
    """The state every part of :class:`~explore.scheduler.core.Core` reads and changes
    (its settings are described there), and the questions asked of it."""

    def __init__(self, policy: Policy, stats: RunStats, *, lockstep: bool = False,
                 part: Callable[[Stack, list[int]], Any] = part_program,
                 switching: bool = True, rotation: int | None = None,
                 switch_limit: int | None = None, timeout: float | None = None) -> None:
        self.policy, self.stats, self.lockstep, self.part = policy, stats, lockstep, part
        self.switching, self.rotation = switching, rotation
        self.switch_limit, self.timeout = switch_limit, timeout
        # rotation: the trial each worker runs now (one at a time, chosen here)
        self.running: dict[int, int] = {}
        self.counts = stats.counts
        self.workers: dict[int, Worker] = {}
        self.waiting: list[Pending] = []
        # Candidates drawn ahead of their turn while the sampler draws blind (the loop's
        # explore.scheduler.core.placing.ahead): each goes to ``waiting`` when the loop would
        # ask for one, the cheapest first (release).  They take no room until then.
        self.ahead: list[Pending] = []
        # Trials switched out of every arena: their state is in a file, they hold no
        # arena bytes.  Paused at a rung, or promoted and waiting for room to come back.
        self.out: dict[int, Placement] = {}
        self.now = 0.0
        self.ready: list[Placement] = []  # lockstep, rotation: to go on in turn (in or out)
        self.in_flight: int | None = None  # lockstep: the trial the worker is running
        self.stack_numbers = -1  # a stack's own number: negative, never a trial's
        self._regroups_waiting = False  # some stack's regroup_due is set
        # Stacks running with members masked for want of room to regroup: due again
        # when memory is given back.
        self._masked: list[tuple[Worker, Stack]] = []
        self._out: list[Command] = []

    def take(self) -> list[Command]:
        """The commands decided since last taken."""
        # counted from what is held, so that no way out of a worker (pruned, resumed,
        # failed, its worker died, Ctrl-C) leaves the count behind
        self.counts["paused"] = len(self.paused())
        self.counts["out"] = len(self.out)
        out, self._out = self._out, []
        return out

    def takes_new(self) -> bool:
        """Whether the run still takes new trials: until ``timeout`` seconds since it
        began, as the last :class:`~.commands.Tick` said (Optuna's ``optimize(timeout=)``).
        After it the trials in hand go on to their end, and paused ones, which no new
        result can promote once nothing else runs, are pruned (:meth:`_idle`) as at the
        end of the trials budget.

        >>> from explore.scheduler.commands import Tick
        >>> from explore.scheduler.core import Core
        >>> core = Core(policy=None, stats=RunStats(1 << 30), timeout=60)  # type: ignore[arg-type]
        >>> core.takes_new(), core.handle(Tick(60.0)), core.takes_new()
        (True, [], False)
        """
        return self.timeout is None or self.now < self.timeout

    def add_worker(self, w: Worker) -> None:
        """A worker with its arena open (a new one, or one taking a dead one's place)."""
        self.workers[w.index] = w

    def in_hand(self) -> int:
        """Trials held and not paused, those promoted while switched out included (they
        run once back): what the sampler's look-ahead is counted in."""
        return sum(w.active() for w in self.workers.values()) + \
            sum(p.paused is None for p in self.out.values())

    def holds(self) -> bool:
        """Whether any trial waits, is held by a worker or is switched out."""
        return bool(self.waiting) or bool(self.ahead) or bool(self.out) or \
            any(w.residents for w in self.workers.values())

    def idle(self) -> bool:
        """Nothing runs nor is about to: no trial goes on in any worker, none is on its
        way out of an arena and no stack is being regrouped.  Then only
        :class:`~.commands.Idle` moves the run on."""
        return not any(w.active() for w in self.workers.values()) and \
            not self._in_transit()

    def room(self) -> int:
        """What the trials' heaps may take of the budget now: the budget less the
        processes' fixed bytes and their measured growth (or the headroom held back for
        it, whichever is more)."""
        s = self.stats
        return s.budget - s.fixed - max(s.growth, s.headroom)

    def heaps(self) -> int:
        """The bytes of the trials' heaps placed in all arenas."""
        return sum(w.heap_bytes() for w in self.workers.values())

    def paused(self) -> list[tuple[Worker | None, Placement]]:
        """Every trial paused at a rung, oldest first, with its worker (None: switched
        out)."""
        held: list[tuple[Worker | None, Placement]] = [
            (w, p) for w in self.workers.values() for p in w.residents.values()
            if p.paused is not None]
        held += [(None, p) for p in self.out.values() if p.paused is not None]
        return sorted(held, key=lambda wp: wp[1].trial.number)

    def _emit(self, *commands: Command) -> None:
        self._out.extend(commands)

    def _stack_number(self) -> int:
        self.stack_numbers -= 1
        return self.stack_numbers + 1

    def _in_transit(self) -> bool:
        """Whether a trial is on its way out of an arena or a stack is being regrouped:
        memory is about to be given back."""
        return any(p.leaving for w in self.workers.values() for p in w.residents.values()) \
            or any(st.regrouping for w in self.workers.values() for st in w.stacks.values())

    def _runs(self, p: Placement) -> bool:
        """Whether ``p`` runs a round now (lockstep, rotation: as the core chose)."""
        n = p.trial.number
        return n == self.in_flight or self.running.get(p.worker) == n

    def _spent(self, w: Worker, spent: dict[str, float]) -> None:
        """The worker's seconds so far by what they went to (``protocol.SPENT``), kept
        by the run's figures (where a dead worker's last word stays)."""
        if spent:
            self.stats.spent[w.index] = dict(spent)
