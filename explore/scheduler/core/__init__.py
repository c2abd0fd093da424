"""The scheduler's decisions, with no process, pipe, clock or storage in them.

:class:`Core` owns what the run holds: each worker's arena (mirrored as a free list),
the trials placed there and the stacks, the paused trials and the candidates waiting
for room, and the trials switched out of every arena (their state in a file).  Events
come in (:mod:`.commands`: a report, a trial's end, a trial's state written out, a
worker's death, a candidate admitted, the time, Ctrl-C) and it answers with commands,
in order: start a candidate at an offset, continue, pause or stop a trial, switch a
trial out of its arena or back into one, regroup a stack, note and tell a trial's end.
The loop (:mod:`.loop`) carries them out and turns the workers' messages into events;
the pruner's word comes from a :class:`~.policy.Policy`.

**Nothing is pruned for lack of room** (unless ``switch_limit`` stops the states
leaving).  A paused trial holds its region while nothing else wants it; when a
candidate, or a promoted trial, finds no room, paused trials leave (``SwitchOut``: the
worker writes the state to a file and gives the region back), the one standing lowest
at its rung first (:meth:`~.policy.Policy.standing`), until the one waiting fits.  A
promoted trial that is out comes back into any arena with room (``SwitchIn``), before
new candidates are placed.  A region is free in the mirror only once the worker says
the state is written (``LeftArena``), as a Start there could overwrite it before.

Because nothing here waits or reads the outside, every decision is a function of the
events so far: the tests drive it directly, and a seeded simulation
(``tests/explore/scheduler/``) runs many schedules against its invariants (the placed
bytes never exceed the budget, every trial in hand ends once, no paused trial is lost).

One job per module, each a layer of :class:`Core` (a class that inherits the layers it
calls on, so that a subclass, such as the simulation's planted bugs, overrides any one
decision and every call to it goes through the override):

- :mod:`.state`: what the run holds and what is read of it (the room, the bytes placed,
  the paused trials, the counts);
- :mod:`.regions`: where a program fits, regions of the arenas taken and given back;
- :mod:`.endings`: a trial failed or pruned, and what its record says;
- :mod:`.switching`: room made by switching paused trials out, promoted ones brought
  back in;
- :mod:`.regrouping`: stacks regrouped when members leave, pause or resume;
- :mod:`.turns`: whose turn it is (lockstep; rotation, when ``in_flight`` exceeds what
  the arenas hold);
- :mod:`.placing`: the order in which what waits is placed;
- :mod:`.events`: :class:`Core` itself, the events it decides on.

>>> from explore.scheduler.commands import Tick
>>> from explore.scheduler.telemetry import RunStats
>>> core = Core(policy=None, stats=RunStats(1 << 30))  # type: ignore[arg-type]
>>> core.handle(Tick(1.5)), core.now
([], 1.5)
"""

from explore.scheduler.core.events import INTERRUPTED, Core

__all__ = ["INTERRUPTED", "Core"]
