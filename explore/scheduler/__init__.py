"""The packing scheduler: exact sizes in, as many trials at once as memory allows.

Memory is accounted, never guessed: the budget covers everything the run's processes
use as the system counts it (PSS): the scheduler's own process, the resource tracker,
each worker (measured after a warm-up), the data set (held once, in shared memory) and
the workers' arenas, split evenly among them and allocated once; a finished trial's
pages go back to the system.  Every
candidate is compiled before anything runs, so its heap is known to the byte; it goes
to the least busy worker with room, into the free segment of its arena that it leaves
the least of (best fit); with ``budget.trials_per_worker`` above one, several trials
share a worker's arena side by side (the worker runs them a round at a time, depth
first).  A trial paused at a rung whose room another needs waits switched out of the
arena, its state in a file, and comes back into any arena with room once promoted:
nothing is pruned for lack of room.  A candidate that cannot fit even an empty arena
at batch 1 is told to Optuna
as failed, with the reason, and costs no training time.  The sum of
what is placed never exceeds the budget: the accounting is checked on every change.

A worker that dies takes its trials with it: they are recorded as failed with the
reason, enqueued once more, and a new worker takes its place.

One job per module:

- :mod:`~explore.scheduler.core`: the decisions, with no process, pipe, clock or
  storage in them (events in, :mod:`~explore.scheduler.commands` out), the pruner's
  word from :mod:`~explore.scheduler.policy`;
- :mod:`~explore.scheduler.loop`: :class:`Scheduler`, which starts the workers, takes
  candidates from :mod:`~explore.scheduler.intake` and moves messages between the
  workers (:mod:`~explore.scheduler.protocol`), the core and the study;
- :mod:`~explore.scheduler.admission`: what a budget admits, and why not;
- :mod:`~explore.scheduler.placement`: the workers' arenas mirrored as free lists
  (:class:`engine.free_list.FreeList`) and the choice of a worker and an offset;
- :mod:`~explore.scheduler.stacking`: trials trained as one stacked program;
- :mod:`~explore.scheduler.switched`: the folder where switched-out trials wait;
- :mod:`~explore.scheduler.worker`: the worker process; :mod:`~.processes` spawns,
  greets and ends workers (their share of the cores, without the parent's
  ``__main__``); :mod:`~.prestart` starts those the budget surely holds ahead of the
  run; :mod:`~.signals`: Ctrl-C, SIGTERM, SIGHUP;
- :mod:`~explore.scheduler.shared_arrays`, :mod:`~.shared_data`: the data set, once,
  in a shared file;
- :mod:`~explore.scheduler.constants`: what the processes cost, remembered per machine;
- :mod:`~explore.scheduler.telemetry`: the packing timeline, counts, the process tree's
  measured peak and its growth;
- :mod:`~explore.scheduler.simulation`: the core under seeded simulated schedules;
- :mod:`~explore.scheduler.errors`: :class:`SchedulerError`.

The names below are imported when first used: a worker process imports its own module
of this package and nothing of the scheduler's (Optuna, the study), whose memory it
would otherwise hold, charged to the budget.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explore.scheduler.errors import SchedulerError
    from explore.scheduler.loop import Scheduler
    from explore.scheduler.placement import Placement, Worker
    from explore.scheduler.telemetry import Progress, RunStats, Sample

_WHERE = {"Scheduler": "loop", "SchedulerError": "errors", "Placement": "placement",
          "Worker": "placement", "Progress": "telemetry", "RunStats": "telemetry",
          "Sample": "telemetry"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'explore.scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"explore.scheduler.{_WHERE[name]}"), name)


__all__ = ["Placement", "Progress", "RunStats", "Sample", "Scheduler", "SchedulerError",
           "Worker"]
