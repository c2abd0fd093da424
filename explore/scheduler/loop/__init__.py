"""The run: ask Optuna for trials, size and place them, and tell it what the workers
report, until the study has ``n_trials`` trials that ended (its total, shared with any
other drivers of the study).

The decisions are the core's (:mod:`explore.scheduler.core`); this loop only moves
messages: it starts the workers and opens their arenas (sized by
:mod:`explore.scheduler.admission`), takes candidates from the intake
(:mod:`explore.scheduler.intake`), turns the workers' messages
(:mod:`explore.scheduler.protocol`) into the core's events and carries out its commands:
a message to a worker, a record or an end written to the study (by
:class:`explore.live.LiveStudy`'s writer thread), a switched-out trial's file dropped
(:mod:`explore.scheduler.switched`).

One job per module, each a layer of :class:`Scheduler`:

- :mod:`.scheduler`: :class:`Scheduler`'s settings and the run's loop;
- :mod:`.relay`: the core's commands carried out, the workers' messages turned into
  its events, a dead worker replaced;
- :mod:`.startup`: the workers started within the budget, their arenas sized, their end;
- :mod:`.state`: the state they share, and the run's accounting.
"""

from explore.scheduler.loop.scheduler import Scheduler, machine_peak

__all__ = ["Scheduler", "machine_peak"]
