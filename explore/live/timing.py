"""Every call a driver makes to the study's storage, timed and counted
(:class:`StorageTime`), the writer thread's apart from the scheduler's; each driver's
figures as it stored them when it closed (:func:`storage_times`)."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage

from explore.live.names import STORAGE_TIME_PREFIX
from explore.optuna_adapter import storage_of, study_id


@dataclass
class StorageTime:
    """Seconds this driver spent in calls to the study's storage, and how many calls,
    on the scheduler's thread (claims, the writes of :meth:`LiveStudy.ask`, refresh
    reads, failing stale trials) and on the writer's (reports, ends, re-queues,
    heartbeats) apart.  A call's seconds are its wall time: waits for the database's
    locks, the network, and for a core while other processes hold them included; its
    CPU seconds are the calling thread's own (SQLAlchemy, the database's client).  Each
    field is written by one thread only, so there is no lock; read them once the study
    is closed for the final figures.
    ``keep_seconds``: the writer's time in the model keeper's part of a trial's end
    (uploading the weights of one of the best and storing the kept list), which goes
    through the study, not through :class:`LiveStudy`'s calls, and is not counted in
    ``writer_calls``."""

    scheduler_seconds: float = 0.0
    scheduler_cpu_seconds: float = 0.0
    scheduler_calls: int = 0
    writer_seconds: float = 0.0
    writer_cpu_seconds: float = 0.0
    writer_calls: int = 0
    keep_seconds: float = 0.0

    def add(self, seconds: float, cpu_seconds: float) -> None:
        """One call of ``seconds`` (``cpu_seconds`` of them the thread's own CPU),
        counted for the thread that made it."""
        if getattr(_on_writer, "yes", False):
            self.writer_seconds += seconds
            self.writer_cpu_seconds += cpu_seconds
            self.writer_calls += 1
        else:
            self.scheduler_seconds += seconds
            self.scheduler_cpu_seconds += cpu_seconds
            self.scheduler_calls += 1

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def storage_times(study: optuna.Study) -> dict[str, dict[str, float | int]]:
    """Each driver's :class:`StorageTime` figures as stored in ``study`` when it
    closed, by driver name (drivers that stopped on a failed write have none)."""
    attrs = storage_of(study).get_study_system_attrs(study_id(study))
    return {k[len(STORAGE_TIME_PREFIX):]: v for k, v in attrs.items()
            if k.startswith(STORAGE_TIME_PREFIX)}


_on_writer = threading.local()  # .yes on a writer's thread (StorageTime.add)
_clock = time.perf_counter  # what StorageTime's seconds are measured with
_cpu_clock = time.thread_time  # and its CPU seconds


class _Timed:
    """A storage whose every method call is timed into a :class:`StorageTime`; the
    rest of it (attributes) is the storage's own."""

    def __init__(self, storage: BaseStorage, spent: StorageTime) -> None:
        self._storage, self._spent = storage, spent

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._storage, name)
        if not callable(attr):
            return attr
        spent = self._spent

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = _clock(), _cpu_clock()
            try:
                return attr(*args, **kwargs)
            finally:
                spent.add(_clock() - t0, _cpu_clock() - c0)

        setattr(self, name, timed)  # looked up once per name
        return timed
