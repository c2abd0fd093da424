"""One study, any number of drivers: the stored study kept live, and a working copy.

Every ``explore run`` on the same storage and study name is a *driver*; drivers on one
machine or many cooperate through the storage alone, as Optuna's own distributed
optimisation does.  A driver's sampler and pruner still work on an in-memory copy of
the study (Optuna's relational storage reads every trial back for each ask, report and
prune decision), but the copy is kept in step with the storage:

- **Claimed when asked.** A trial exists in the storage from the moment it is asked
  for: created RUNNING with its parameters and the driver's record (host, pid, device)
  in one write, or a trial queued in the storage (WAITING: re-queued after a crash)
  taken over atomically.  Its intermediate values are written as they are reported and
  its result when it ends, by a writer thread, in order.
- **Refreshed.** At least every :data:`REFRESH_EVERY` seconds, and before each claim,
  the driver reads what changed in the storage (Optuna's cached storage and the
  journal read only new and unfinished trials) and mirrors the other drivers' trials
  into its copy: running ones with their parameters, so TPE's constant liar avoids
  them; finished ones with their values, for the sampler and the pruner.
- **A study-wide total.** ``budget.trials`` counts the study's trials that ended on
  their own (complete, pruned, or failed for a reason of their own: a trial failed
  because its process died is re-queued and not counted).  A driver claims another
  only while those and the running ones are fewer; after claiming it checks that fewer
  than the total come before its trial, and a trial that lost such a race goes back to
  the queue (WAITING, its parameters fixed) for a later run.
- **Heartbeats.** The writer records the driver's heartbeat in the study every
  :data:`HEARTBEAT_EVERY` seconds (a quarter of ``grace`` if that is shorter).  A
  running trial whose driver has been silent for ``grace`` seconds is failed as stale,
  with the reason, by any live driver (or the next run), and re-queued once with the
  same parameters.  A driver waits for trials whose driver has gone quiet before it
  ends, so a study whose driver died mid-run still ends with its total.
- **Nothing finished is lost.** A failed write stops the run at once
  (:class:`WriteFailed`); what was written before stays.
- **Measured.** Every call to the storage is timed and counted, the writer's thread
  apart from the scheduler's (:class:`StorageTime`, :attr:`LiveStudy.storage_time`);
  the writer's last write stores the figures in the study under the driver's name
  (:data:`STORAGE_TIME_PREFIX`), so that each driver's are there whatever the others do.

>>> import optuna
>>> from explore.space import parse_space
>>> optuna.logging.set_verbosity(optuna.logging.WARNING)
>>> s = parse_space({"dataset": "digits", "budget": {"trials": 2, "rounds": 1,
...     "memory": "64MB"}, "sampler": {"name": "random", "seed": 0}})
>>> stored = optuna.create_study(direction="maximize")
>>> live = LiveStudy(stored, s, total=2, device="cpu")
>>> claim = live.claim()
>>> trial = live.ask(claim, lambda t: {"x": t.suggest_float("x", 0, 1)})
>>> live.finish(trial, 0.5); live.close()
>>> [(t.state.name, t.value) for t in stored.trials]
[('COMPLETE', 0.5)]
"""

from explore.live.names import (
    CLAIM_ATTR,
    FLAT,
    GRACE,
    HEARTBEAT_EVERY,
    HEARTBEAT_PREFIX,
    REFRESH_EVERY,
    REQUEUED_FROM,
    STORAGE_TIME_PREFIX,
    Claim,
    Ours,
    WriteFailed,
    counted,
    driver_host_pid,
    driver_name,
)
from explore.live.study import LiveStudy
from explore.live.timing import StorageTime, storage_times

__all__ = ["CLAIM_ATTR", "FLAT", "GRACE", "HEARTBEAT_EVERY", "HEARTBEAT_PREFIX",
           "REFRESH_EVERY", "REQUEUED_FROM", "STORAGE_TIME_PREFIX", "Claim", "LiveStudy",
           "Ours", "StorageTime", "WriteFailed", "counted", "driver_host_pid", "driver_name",
           "storage_times"]
