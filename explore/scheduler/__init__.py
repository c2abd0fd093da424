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
first).  A candidate that cannot fit even an empty arena at batch 1 is told to Optuna
as failed, with the reason, and costs no training time.  The sum of
what is placed never exceeds the budget: the accounting is checked on every change.

A worker that dies takes its trials with it: they are recorded as failed with the
reason, enqueued once more, and a new worker takes its place.

One job per module:

- :mod:`~explore.scheduler.loop`: :class:`Scheduler`, the ask/tell loop over Optuna
  and the workers' messages (:mod:`explore.protocol`);
- :mod:`~explore.scheduler.placement`: the workers' arenas mirrored as free lists
  (:class:`engine.free_list.FreeList`) and the choice of a worker and an offset;
- :mod:`~explore.scheduler.processes`: spawning workers (their share of the cores,
  without the parent's ``__main__``), their start-up handshake, ending them;
- :mod:`~explore.scheduler.shared_data`: the data set loaded once, in shared memory;
- :mod:`~explore.scheduler.constants`: what the processes cost, remembered per machine;
- :mod:`~explore.scheduler.telemetry`: the packing timeline, counts, the process tree's
  measured peak and its growth;
- :mod:`~explore.scheduler.errors`: :class:`SchedulerError`.
"""

from explore.scheduler.errors import SchedulerError
from explore.scheduler.loop import Scheduler
from explore.scheduler.placement import Placement, Worker
from explore.scheduler.telemetry import Progress, RunStats, Sample

__all__ = ["Placement", "Progress", "RunStats", "Sample", "Scheduler", "SchedulerError",
           "Worker"]
