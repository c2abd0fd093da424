"""A deterministic simulation of one driver's run: the decision core
(:mod:`explore.scheduler.core`) against simulated workers, messages that cross, workers
that die, processes that grow, and Ctrl-C, every choice drawn from one seed.

A schedule is what one seed makes of a run: how many workers and what arenas, which
candidates (alone or stacked, each with several programs to fall back on), what the
pruner says of each report, and, step by step, which message is delivered next, which
worker runs a round, which dies, which switched-out state cannot be written.  A
simulated worker keeps each resident's region of its arena, and a switched-out
trial's state in a simulated file, so what the core decides is checked against what
the workers would hold: no region overwritten, no state read that was not written,
no round lost or run twice across switches, nothing pruned for lack of room.

After every step the invariants are checked; a failing seed raises
:class:`Violation` naming the seed and the step, and ``simulate(seed)`` replays the
same schedule exactly (nothing here reads a clock or the system's randomness).
``tests/explore/scheduler/test_simulation.py`` runs thousands of seeds.

Its parts: the schedule and the loop's side of it (:mod:`.schedule`:
:class:`Simulation`, :func:`simulate`), what the simulated workers do
(:mod:`.workers`) and the invariants (:mod:`.invariants`, :class:`Violation`); the
simulated trials, programs, pruner and worker state are
:mod:`explore.scheduler.simulated`'s.

>>> result = simulate(7)
>>> result.ended == result.trials and result.steps > 0
True
"""

from explore.scheduler.simulation.invariants import Violation
from explore.scheduler.simulation.schedule import MAX_STEPS, Result, Simulation, simulate

__all__ = ["MAX_STEPS", "Result", "Simulation", "Violation", "simulate"]
