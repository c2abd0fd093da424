"""The simulated world of :mod:`explore.live.simulation`: the drivers' shared in-memory
storage (stamping trials with the virtual clock), each driver's own view of it (its
calls counted by kind and made to fail on demand), a driver, a schedule's result, and
the small search space the drivers sample.
"""


from __future__ import annotations

import abc
import copy
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from explore.live import CLAIM_ATTR, Claim, LiveStudy
from explore.space import Space, parse_space
from explore.study import RECORD_ATTR

MAX_STEPS = 3_000  # a schedule not over by then is stuck
MAX_SLEEPS = 20_000  # waits of one schedule for claims being written (LiveStudy._lost)
EPOCH = 1_700_000_000.0  # the virtual clock's start (a date: trials' starts are stamped)
STUDY = "simulated"
SIMULATED = "simulated: the storage failed on "  # the message of an injected failure


@cache
def sim_space(sampler: str, wide: bool = False) -> Space:
    """The space the simulated drivers search: 8 points (width, learning rate, batch
    size), or a continuous learning rate (``wide``: no duplicates to speak of)."""
    lr: Any = {"float": [0.001, 0.1], "log": True} if wide else {"choice": [0.01, 0.1]}
    return parse_space({
        "name": STUDY, "dataset": "digits", "sampler": {"name": sampler, "seed": 0},
        "pruner": "none", "budget": {"trials": 1, "rounds": 2, "memory": "300MB",
                                     "workers": 1},
        "model": {"depth": 1, "width": {"choice": [8, 16]}},
        "training": {"optimizer": "adam", "lr": lr, "batch_size": {"choice": [16, 32]}}})


# -- the storage ----------------------------------------------------------------------------
class SharedStorage(InMemoryStorage):
    """The study's storage: Optuna's in-memory one, with a trial taken from the queue
    stamped by the virtual clock (Optuna stamps it with the machine's), and each trial
    failed as stale told to ``on_stale`` (its driver's name)."""

    def __init__(self, clock: Callable[[], float],
                 on_stale: Callable[[str | None], None]) -> None:
        super().__init__()
        self.clock, self.on_stale = clock, on_stale

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        ok = super().set_trial_state_values(trial_id, state, values)
        if ok and state == TrialState.RUNNING:
            with self._lock:
                t = copy.copy(self._get_trial(trial_id))
                t.datetime_start = datetime.fromtimestamp(self.clock())
                self._set_trial(trial_id, t)
        elif ok and state == TrialState.FAIL:
            t = self._get_trial(trial_id)
            record = t.user_attrs.get(RECORD_ATTR, {})
            if "failed_by" in record:
                self.on_stale(record.get("driver") or t.user_attrs.get(CLAIM_ATTR))
        return bool(ok)


_READS = ("get_", "read_")


class DriverStorage(BaseStorage):
    """One driver's way to the shared storage: every call is passed on and counted by
    its name; ``fail_in``: the call (1: the next one) that raises instead, as a storage
    whose disk is full or whose server went away; ``measure``: the bytes each call
    moves are estimated (pickled sizes: what a database would send, roughly)."""

    def __init__(self, shared: SharedStorage, measure: bool = False) -> None:
        self.shared, self.measure = shared, measure
        self.calls: Counter[str] = Counter()
        self.fail_in: int | None = None
        self.failed: str | None = None  # the call that failed
        self.bytes_read = self.bytes_written = 0
        self.bytes_cached = 0  # what Optuna's cached storage would read (see _read_all)
        self._finished_below = -1  # (cached storage) the ids it has no need to read again
        self._unfinished: set[int] = set()
        self._sizes: dict[int, tuple[FrozenTrial, int]] = {}

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls[name] += 1
        if self.fail_in is not None:
            self.fail_in -= 1
            if self.fail_in <= 0:
                self.fail_in, self.failed = None, name
                raise OSError(SIMULATED + name)
        result = getattr(self.shared, name)(*args, **kwargs)
        if self.measure:
            if name == "get_all_trials":
                self._read_all(result)
            elif name.startswith(_READS):
                self.bytes_read += len(pickle.dumps(result))
            else:
                self.bytes_written += len(pickle.dumps((args, kwargs)))
        return result

    def _size(self, t: FrozenTrial) -> int:
        known = self._sizes.get(id(t))  # the trial object is kept: its id is not reused
        if known is None or known[0] is not t:
            known = self._sizes[id(t)] = (t, len(pickle.dumps(t)))
        return known[1]

    def _read_all(self, trials: list[FrozenTrial]) -> None:
        """All the study's trials read: their bytes, and the part of them that Optuna's
        cached storage (``_CachedStorage``, in front of a database) reads again: the
        trials unfinished at its last read and the newer ones."""
        for t in trials:
            size = self._size(t)
            self.bytes_read += size
            tid = t._trial_id
            if tid > self._finished_below or tid in self._unfinished:
                self.bytes_cached += size
        finished = [t._trial_id for t in trials if t.state.is_finished()]
        self._unfinished = {t._trial_id for t in trials if not t.state.is_finished()}
        if finished:
            self._finished_below = max(self._finished_below, max(finished))


def _delegate(name: str) -> Callable[..., Any]:
    def call(self: DriverStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, args, kwargs)

    call.__name__ = name
    return call


for _name, _member in vars(BaseStorage).items():
    if callable(_member) and not _name.startswith("_"):
        setattr(DriverStorage, _name, _delegate(_name))
abc.update_abstractmethods(DriverStorage)  # type: ignore[type-abstract]


# -- the drivers ------------------------------------------------------------------------------
@dataclass
class Driver:
    """One simulated driver: its study side, what it holds, and how it is."""

    index: int
    name: str
    pid: int
    storage: DriverStorage
    live: LiveStudy
    capacity: int  # trials it holds at once (its workers)
    state: str = "running"  # or ended (settled), died, stopped (a failed write)
    pending: list[Claim] = field(default_factory=list)  # claimed, not yet asked
    held: list[Trial] = field(default_factory=list)  # asked, not yet ended
    gone_at: float | None = None  # when it died or stopped
    detected: bool = False  # one of its trials was failed as stale since
    why: str = ""  # why it stopped


@dataclass
class Result:
    seed: int
    sampler: str
    drivers: int
    total: int
    grace: float
    steps: int
    counted: int
    states: dict[str, int]  # the study's trials at the end, by state
    duplicates: int  # counted trials whose parameters an earlier counted one had
    # claims that lost a race, by how, and "writes dropped": a stalled driver's writes
    # to its trials that another failed as stale meanwhile
    conflicts: dict[str, int]
    died: int  # drivers that died or stopped
    stops: dict[str, int]  # drivers stopped by WriteFailed, by cause (an injected storage
    # failure: "storage failed")
    next_run: bool  # whether a next run was needed to bring the study to its total
    ended_short: int  # drivers that ended by themselves with the study short of its total
    detect: list[float]  # seconds from a driver's end to the first of its trials failed stale
    unexplained: list[str]  # storage failures that reached the driver not as WriteFailed
    calls: dict[str, dict[str, int]]  # storage calls by driver and kind
    bytes: dict[str, int]  # (measure) bytes read, written, and read through a cache
