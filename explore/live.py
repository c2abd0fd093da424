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

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, cast

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from explore.optuna_adapter import grid_points, storage_of, study_id, trial_id
from explore.procmem import alive as process_alive
from explore.space import Space
from explore.study import PARAMS_ATTR, RECORD_ATTR, Keep, make_pruner, make_sampler

HEARTBEAT_EVERY = 5.0  # seconds between a driver's heartbeats
REFRESH_EVERY = 2.0  # seconds between reads of the other drivers' trials
GRACE = 60.0  # default seconds of silence after which a driver's trials are stale
HEARTBEAT_PREFIX = "explore:heartbeat:"  # a study system attribute per driver
REQUEUED_FROM = "requeued_from"  # user attribute: the trial a re-queued one repeats
CLAIM_ATTR = "explore_claim"  # user attribute: the driver that claimed a trial
STORAGE_TIME_PREFIX = "explore:storage-time:"  # a study system attribute per driver


# Numbers of a placed trial's record also stored as user attributes of their own (record
# key -> attribute): what a dashboard shows of a running trial at a glance, its planned
# heap bytes first (optuna-dashboard lists attributes by name), batch and placement.
FLAT = {"total_bytes": "bytes_planned", "batch_size": "batch_size", "worker": "worker",
        "device_index": "device_index"}


class WriteFailed(RuntimeError):
    """A call to the study's storage failed (a write, or a read during the run): the
    run stops at once.  The message says what it means (:func:`explore.storages.explain`)."""


def counted(t: FrozenTrial) -> bool:
    """Whether ``t`` counts towards the study's ``budget.trials``: it ended on its own
    (a trial failed because its driver or worker died, or by an interrupt, was
    re-queued and its repeat counts instead)."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and not t.user_attrs.get(RECORD_ATTR, {}).get("retried")


def driver_name() -> str:
    """This process's name as a driver: host, pid and a random tag (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def driver_host_pid(name: Any) -> tuple[str | None, int | None]:
    """The host and pid of a :func:`driver_name` (None, None for anything else).

    >>> driver_host_pid("node-3:4242:ab12cd"), driver_host_pid(None)
    (('node-3', 4242), (None, None))
    """
    parts = name.split(":") if isinstance(name, str) else []
    if len(parts) < 3 or not parts[-2].isdigit():
        return None, None
    return ":".join(parts[:-2]), int(parts[-2])


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


@dataclass
class Claim:
    """A trial of the storage this driver took (RUNNING, no parameters yet): a new
    one, or one taken from the queue with the parameters it was queued with."""

    stored_id: int
    number: int
    fixed: dict[str, Any] | None = None  # a queued trial's parameters
    requeued_from: int | None = None


@dataclass
class Ours:
    """One of this driver's trials: its id and number in the storage."""

    stored_id: int
    number: int
    requeued_from: int | None
    reported: set[int] = field(default_factory=set)
    params: set[str] = field(default_factory=set)  # written to the storage


class LiveStudy:
    """The stored study ``stored`` shared with any other drivers, and the working copy
    :attr:`work` that this driver's sampler and pruner consult.  ``total``: the study's
    ``budget.trials``; ``grace``: seconds without a heartbeat after which another
    driver's running trials are stale.

    What the driver reads of the world can be given, for a deterministic simulation of
    several drivers (:mod:`explore.study_simulation`); the defaults are the real ones.
    ``clock``: the time now, in seconds since the epoch (when to read again,
    heartbeats, silences, the start a claim is stamped with); ``sleep``: how the driver waits for a
    claim before its own to be written; ``alive``: whether a process of this host
    lives; ``driver``: this driver's name (:func:`driver_name`; the host and pid it
    names are the record's); ``inline``: every write done at once on the caller's
    thread rather than by a writer thread, the heartbeat when one is due
    (:meth:`_Writer.tick`)."""

    def __init__(self, stored: optuna.Study, space: Space, *, total: int, device: str,
                 grace: float = GRACE, worker_record: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 alive: Callable[[int], bool] = process_alive, driver: str | None = None,
                 inline: bool = False) -> None:
        self.stored, self.total, self.grace, self.device = stored, total, grace, device
        self.clock, self.sleep, self.alive = clock, sleep, alive
        self.space = space
        self.every = min(HEARTBEAT_EVERY, grace / 4)  # seconds between heartbeats
        # Every storage call of this driver goes through `storage`, timed and counted.
        self.storage_time = StorageTime()
        self.raw_storage = storage_of(stored)
        self.storage = cast(BaseStorage, _Timed(self.raw_storage, self.storage_time))
        self.study_id = study_id(stored)
        # The stored study's name: Hyperband assigns a trial to a bracket by a hash of
        # the study's name and the trial's number, and an unnamed study gets a random one.
        self.work = optuna.create_study(study_name=stored.study_name,
                                        directions=list(stored.directions),
                                        sampler=make_sampler(space), pruner=make_pruner(space))
        self.wstorage = storage_of(self.work)
        self.driver = driver_name() if driver is None else driver
        host, pid = driver_host_pid(driver)
        self.host, self.pid = (socket.gethostname(), os.getpid()) if host is None or pid is None \
            else (host, pid)
        self.ours: dict[int, Ours] = {}  # working-copy trial id -> stored
        self.our_ids: set[int] = set()  # stored ids of our trials
        # stored id -> (work id; state, intermediate values and parameters mirrored)
        self.mirrored: dict[int, tuple[int, TrialState, int, int]] = {}
        self.view: list[FrozenTrial] = []
        self.beats: dict[str, float] = {}
        self.read_at = self.beats_at = 0.0
        # grid search runs each point once, across drivers (explore.live._lost)
        self.unique = space.sampler.name == "grid"
        self.held: dict[str, Any] | None = None  # a point drawn and lost to the total
        self.writer = _Writer(self, inline)
        self.refresh(force=True)

    # -- reading ---------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Read what changed in the storage (if :data:`REFRESH_EVERY` has passed, or
        ``force``), mirror the other drivers' trials into the working copy, and fail
        the trials of drivers silent for longer than ``grace``."""
        now = self.clock()
        if not force and now - self.read_at < REFRESH_EVERY:
            return
        self.check()
        self.read_at = now
        try:
            self.view = self.storage.get_all_trials(self.study_id, deepcopy=False)
        except Exception as e:  # a server gone, a corrupt file: said as such
            raise WriteFailed(_failed(e)) from None
        for t in self.view:
            if trial_id(t) not in self.our_ids:
                self._mirror(t)
        if now - self.beats_at >= self.every or force:
            self.beats_at = now
            try:
                attrs = self.storage.get_study_system_attrs(self.study_id)
            except Exception as e:
                raise WriteFailed(_failed(e)) from None
            self.beats = {k[len(HEARTBEAT_PREFIX):]: float(v) for k, v in attrs.items()
                          if k.startswith(HEARTBEAT_PREFIX)}
            for t in self.view:
                if t.state == TrialState.RUNNING and trial_id(t) not in self.our_ids and \
                        self._silence(t, now) > self.grace:
                    self._fail_stale(t, now)

    def _silence(self, t: FrozenTrial, now: float) -> float:
        """Seconds since the driver of another's running trial was last heard from
        (infinite for a driver of this host whose process is gone: no need to wait)."""
        record = t.user_attrs.get(RECORD_ATTR, {})
        driver = record.get("driver") or t.user_attrs.get(CLAIM_ATTR)
        # by its record, or by its claim's name when the record is not written yet (a
        # driver killed between the two is gone as surely)
        host, pid = (record.get("host"), record.get("pid")) if "pid" in record \
            else driver_host_pid(driver)
        if host == self.host and isinstance(pid, int) and not self.alive(pid):
            return float("inf")
        beat = self.beats.get(driver) if driver else None
        if beat is None:  # never beat (killed at once), or not one of ours: its start
            start = t.datetime_start
            beat = start.timestamp() if start is not None else now
        return now - beat

    def _mirror(self, t: FrozenTrial) -> None:
        """Another driver's trial into the working copy, or its news."""
        if t.state == TrialState.WAITING:
            return
        known = self.mirrored.get(trial_id(t))
        if known is None:
            if t.state == TrialState.RUNNING and RECORD_ATTR not in t.user_attrs:
                return  # its parameters are being written: mirrored at the next read
            template = optuna.trial.FrozenTrial(
                number=0, state=t.state, value=None, values=t.values,
                datetime_start=t.datetime_start, datetime_complete=t.datetime_complete,
                params=t.params, distributions=t.distributions, user_attrs=t.user_attrs,
                system_attrs={k: v for k, v in t.system_attrs.items() if k != "fixed_params"},
                intermediate_values=dict(t.intermediate_values), trial_id=0)
            wid = self.wstorage.create_new_trial(study_id(self.work), template_trial=template)
            self.mirrored[trial_id(t)] = (wid, t.state, len(t.intermediate_values),
                                          len(t.params))
            return
        wid, state, steps, n_params = known
        if (state, steps, n_params) == (t.state, len(t.intermediate_values), len(t.params)):
            return
        if state == TrialState.RUNNING:
            # a read may have caught its parameters half written (SQLite reads them
            # apart from its attributes): the rest arrive while it runs
            have = self.wstorage.get_trial(wid).params
            for name, value in t.params.items():
                if name not in have:
                    dist = t.distributions[name]
                    self.wstorage.set_trial_param(wid, name, dist.to_internal_repr(value), dist)
            for step, v in t.intermediate_values.items():
                self.wstorage.set_trial_intermediate_value(wid, step, v)
            if t.state.is_finished():
                self.wstorage.set_trial_state_values(wid, t.state, t.values)
        self.mirrored[trial_id(t)] = (wid, t.state, len(t.intermediate_values), len(t.params))

    def counts(self) -> tuple[int, int]:
        """(trials counted towards the total, trials running), study-wide, as last read."""
        done = sum(counted(t) for t in self.view)
        return done, sum(t.state == TrialState.RUNNING for t in self.view)

    def unclaimed(self) -> int:
        """Trials of the total that no one has claimed yet, as last read."""
        done, running = self.counts()
        return max(0, self.total - done - running)

    def settled(self) -> bool:
        """Whether this driver, holding no trial, may end: the study has its total, or
        will have it from trials that live drivers run (a trial whose driver has gone
        quiet is waited for until it ends or turns stale, so it is re-run here)."""
        self.refresh(force=True)  # an end decided on a stale view could leave trials queued
        done, running = self.counts()
        if done >= self.total:
            return True
        now = self.clock()
        quiet = any(t.state == TrialState.RUNNING and trial_id(t) not in self.our_ids
                    and self._silence(t, now) > 3 * self.every for t in self.view)
        return not quiet and done + running >= self.total and \
            not any(t.state == TrialState.WAITING for t in self.view)

    # -- claiming --------------------------------------------------------------------------
    def claim(self) -> Claim | None:
        """A trial of the study this driver may start: one queued in the storage
        (WAITING, taken over atomically; the oldest first) or a new empty RUNNING one;
        None while the trials that ended and those running reach the total."""
        self.refresh(force=True)
        done, running = self.counts()
        if done + running >= self.total:
            return None
        for t in sorted((t for t in self.view if t.state == TrialState.WAITING),
                        key=lambda t: t.number):
            try:
                taken = self.storage.set_trial_state_values(trial_id(t), TrialState.RUNNING)
            except (UpdateFinishedTrialError, KeyError):
                taken = False  # finished or taken meanwhile
            except Exception as e:
                raise WriteFailed(_failed(e)) from None
            if taken:  # ours: no other driver's change from WAITING succeeded
                # named as ours, as a new claim is: the others judge it by this driver's
                # heartbeats, not by when it was taken, while its parameters are drawn
                sid = trial_id(t)
                self._write(partial(self.storage.set_trial_user_attr, sid, CLAIM_ATTR,
                                    self.driver))
                self.our_ids.add(sid)
                return Claim(sid, t.number, t.system_attrs.get("fixed_params"),
                             t.user_attrs.get(REQUEUED_FROM))
        template = optuna.trial.FrozenTrial(
            number=0, state=TrialState.RUNNING, value=None, values=None,
            datetime_start=datetime.fromtimestamp(self.clock()), datetime_complete=None, params={},
            distributions={}, user_attrs={CLAIM_ATTR: self.driver}, system_attrs={},
            intermediate_values={}, trial_id=0)
        sid = self._write(lambda: self.storage.create_new_trial(self.study_id,
                                                                template_trial=template))
        self.our_ids.add(sid)  # never failed as stale by this driver, nor waited for
        return Claim(sid, self._write(lambda: self.storage.get_trial_number_from_id(sid)))

    def ask(self, claim: Claim, suggest: Callable[[Trial], Any]) -> Trial | None:
        """The working copy's trial for ``claim``, its parameters drawn by ``suggest``
        (given the fixed ones of a queued trial) and written to the claimed trial with
        this driver's record.  First the claim is checked against the trials claimed
        before it (by their numbers in the storage): if those reach the study's total,
        or (grid search) one has the same parameters, the stored trial goes back to
        the queue, empty, and None is returned (a grid point taken is drawn again)."""
        fixed = claim.fixed
        if not fixed and self.held:  # a point this driver drew and lost to the total
            fixed, self.held = self.held, None
        for attempt in range(8):
            trial = self._ask_work(fixed, claim.number, attempt)
            params = suggest(trial)
            frozen = self.wstorage.get_trial(trial_id(trial))
            lost = self._lost(claim.number, params)
            if lost is None and not claim.fixed and not self.unique and attempt < 7 and \
                    self._same_point(claim.number, params, fresh=False) is not None:
                # another trial of the study holds these parameters already (a small
                # space of choices): drawn again, with other randomness
                self.work.tell(trial, state=TrialState.FAIL)
                continue
            if lost is None:
                break
            self.work.tell(trial, state=TrialState.FAIL)  # never stored: the sampler skips it
            if lost == "total":  # the same point is drawn again at the next claim
                self.held = dict(self.wstorage.get_trial(trial_id(trial)).params)
                break
            # Taken by another driver.  This copy's grid sampler counts the points it
            # gave up as visited, so near the end it may see the grid exhausted while the
            # study still lacks a point: take one that no written trial holds.
            if claim.fixed:  # a queued repeat whose point ran meanwhile: not again
                break
            free = self._free_point(claim.number)
            if free is not None:
                fixed = free
                continue
            if fixed:
                break
        if lost is not None:
            self.our_ids.discard(claim.stored_id)
            if lost == "duplicate" and claim.fixed:
                self._give_up(claim, "its grid point ran meanwhile as another trial")
            else:
                self._write(lambda: self._unclaim(claim.stored_id))
            return None
        record = self._record({}, claim.requeued_from)
        sid = claim.stored_id

        def write() -> None:  # the record last: others mirror a trial once it is there
            for name, value in frozen.params.items():
                dist = frozen.distributions[name]
                self.storage.set_trial_param(sid, name, dist.to_internal_repr(value), dist)
            for key, value in frozen.system_attrs.items():  # a grid point's id, say
                self.storage.set_trial_system_attr(sid, key, value)
            self.storage.set_trial_user_attr(sid, PARAMS_ATTR, params)
            self.storage.set_trial_user_attr(sid, RECORD_ATTR, record)

        self._write(write)
        other = self._same_point(claim.number, params) if self.unique else None
        if other is not None:
            # Written at the same moment as another claim of the point, which the check
            # above could not see: a claim taken from the queue has an early number, so
            # claims after it did not wait for it, nor it for them.  Both writes are in
            # now; each side that sees the other gives way (both may: the point is then
            # drawn again once the grid looks exhausted, see _free_point).
            self.work.tell(trial, state=TrialState.FAIL)
            self.our_ids.discard(sid)
            self._give_up(claim, f"its grid point was claimed at the same time by trial "
                          f"{other}", record)
            return None
        self.our_ids.add(sid)
        self.ours[trial_id(trial)] = Ours(sid, claim.number, claim.requeued_from,
                                          params=set(frozen.params))
        return trial

    def _same_point(self, number: int, params: dict[str, Any], fresh: bool = True
                    ) -> int | None:
        """The number of another trial that holds ``params`` (running with its record
        written, or counted), read afresh (or as last read, without ``fresh``); None if
        there is none."""
        if fresh:
            self.refresh(force=True)
        return next((t.number for t in self.view if t.number != number
                     and t.user_attrs.get(PARAMS_ATTR) == params
                     and ((t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs)
                          or counted(t))), None)

    def _give_up(self, claim: Claim, why: str, record: dict[str, Any] | None = None) -> None:
        """End ``claim`` as a failure that does not count towards the total."""
        full = {**(record or self._record({}, claim.requeued_from)),
                "fail_reason": why, "retried": True}

        def write() -> None:
            self.storage.set_trial_user_attr(claim.stored_id, RECORD_ATTR, full)
            self.storage.set_trial_state_values(claim.stored_id, TrialState.FAIL)

        self._write(write)

    def _free_point(self, number: int) -> dict[str, Any] | None:
        """A grid point that no trial of the study holds (running with its parameters
        written, or counted), the first in the grid's order; None if there is none or the
        sampler is not a grid."""
        points = grid_points(self.work.sampler)
        if not points:
            return None
        taken = [t.params for t in self.view if t.number != number and (
            counted(t) or (t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs))]
        # a queued repeat holds its point: it runs once a driver takes it
        taken += [t.system_attrs["fixed_params"] for t in self.view
                  if t.state == TrialState.WAITING and t.system_attrs.get("fixed_params")]
        return next((p for p in points if p not in taken), None)

    def _ask_work(self, fixed: dict[str, Any] | None, number: int, attempt: int = 0
                  ) -> Trial:
        """A working-copy trial, with ``fixed`` parameters where a queued trial has
        them; parameters the sampler cannot take (a grid point of another space: the
        space changed between runs) are dropped, and the trial is drawn afresh.  Its
        sampler's randomness is the stored trial ``number``'s (:func:`make_sampler`):
        no two trials of the study share it, whichever driver or run draws them."""
        if not self.unique:  # a grid keeps one sampler: its points are made distinct
            # across drivers by the claims (_lost, _free_point), not by randomness
            self.work.sampler = make_sampler(self.space, number, attempt)
        if not fixed:
            return self.work.ask()
        self.work.enqueue_trial(fixed, skip_if_exists=False)
        try:
            return self.work.ask()
        except ValueError:
            return self.work.ask()

    def _lost(self, number: int, params: dict[str, Any]) -> str | None:
        """Why claim ``number`` must give way, or None: "total" if the trials claimed
        before it that ended or run reach the study's total, "duplicate" if (grid
        search) one of them has the same ``params``.  Waits (30 s at most) for the
        parameters of claims before it that are being written."""
        # A claim's parameters may wait behind other writers (SQLite takes one at a
        # time); one whose driver went quiet is not waited for (it turns stale).
        deadline = self.clock() + 30.0
        while True:
            self.refresh(force=True)
            before = [t for t in self.view if t.number < number]
            now = self.clock()
            if now > deadline or not any(
                    t.state == TrialState.RUNNING and RECORD_ATTR not in t.user_attrs
                    and trial_id(t) not in self.our_ids
                    and self._silence(t, now) <= 3 * self.every for t in before):
                break
            self.sleep(0.01)
        if sum(counted(t) or (t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs)
               for t in before) >= self.total:
            return "total"
        # Any trial whose parameters are written, later numbers too: a claim taken from
        # the queue has an early number but was not waited for by later ones.
        # (By the parameters as the trial's own user attribute: SQLite reads a trial's
        # parameters and its attributes in separate statements, so a read between a
        # writer's two may see its record with parameters missing.)
        if self.unique and any(
                t.user_attrs.get(PARAMS_ATTR) == params and t.number != number
                and ((t.state == TrialState.RUNNING and RECORD_ATTR in t.user_attrs)
                     or counted(t)) for t in self.view):
            return "duplicate"
        return None

    def stored_number(self, trial: Trial) -> int:
        """``trial``'s number in the storage (the one users see)."""
        return self.ours[trial_id(trial)].number

    def requeued(self, trial: Trial) -> bool:
        """Whether ``trial`` repeats one that failed when its process died."""
        return self.ours[trial_id(trial)].requeued_from is not None

    # -- writing (on the writer thread, in order) -------------------------------------------
    def record(self, trial: Trial, record: dict[str, Any]) -> None:
        """Write the trial's record (one user attribute), and the numbers of it a
        dashboard sorts and plots by as user attributes of their own (:data:`FLAT`):
        optuna-dashboard shows a dict as one line of JSON, cut at 1,024 characters."""
        ours = self.ours[trial_id(trial)]
        sid, full = ours.stored_id, self._record(record, ours.requeued_from)
        flat = {name: full[k] for k, name in FLAT.items() if isinstance(full.get(k), int)}

        def write() -> None:
            self.storage.set_trial_user_attr(sid, RECORD_ATTR, full)
            for k, v in flat.items():
                self.storage.set_trial_user_attr(sid, k, v)

        self.writer.put(write)

    def new_params(self, trial: Trial) -> None:
        """Write the parameters ``trial`` was given since it was claimed (a model
        builder asks for its own while the trial is compiled)."""
        ours = self.ours[trial_id(trial)]
        frozen = self.wstorage.get_trial(trial_id(trial))
        new = {k: (v, frozen.distributions[k]) for k, v in frozen.params.items()
               if k not in ours.params}
        if not new:
            return
        ours.params.update(new)
        sid = ours.stored_id

        def write() -> None:
            for name, (value, dist) in new.items():
                self.storage.set_trial_param(sid, name, dist.to_internal_repr(value), dist)

        self.writer.put(write)

    def report(self, trial: Trial, step: int, value: float) -> None:
        """Write an intermediate value (a dashboard shows it while the trial runs)."""
        ours = self.ours[trial_id(trial)]
        ours.reported.add(step)
        sid = ours.stored_id
        self.writer.put(lambda: self.storage.set_trial_intermediate_value(sid, step, value))

    def finish(self, trial: Trial, values: Any = None, state: TrialState | None = None,
               keep: Keep | None = None, retry: bool = False) -> None:
        """Tell the working copy, then write the result: the trial's user attributes,
        its remaining intermediate values and its state.  ``retry``: it failed because
        its process died or was interrupted; a new trial with its parameters is
        queued (once, unless it was interrupted: then always)."""
        self.new_params(trial)
        self.work.tell(trial, values, state=state)
        frozen = self.wstorage.get_trial(trial_id(trial))
        ours = self.ours.pop(trial_id(trial))

        def write() -> None:
            t0 = _clock()
            t = keep.before(frozen) if keep is not None else frozen
            self.storage_time.keep_seconds += _clock() - t0
            for k, v in t.user_attrs.items():
                if k == RECORD_ATTR:
                    v = self._record({**v, "retried": True} if retry else v,
                                     ours.requeued_from)
                self.storage.set_trial_user_attr(ours.stored_id, k, v)
            for step, v in t.intermediate_values.items():
                if step not in ours.reported:
                    self.storage.set_trial_intermediate_value(ours.stored_id, step, v)
            self.storage.set_trial_state_values(ours.stored_id, t.state, t.values)
            if retry:
                self._requeue(frozen.params, ours.number)
            if keep is not None:
                t0 = _clock()
                keep.after(ours.number)
                self.storage_time.keep_seconds += _clock() - t0

        self.writer.put(write)

    def _record(self, record: dict[str, Any], requeued_from: int | None) -> dict[str, Any]:
        """A trial's record as stored: who runs it (driver, host, pid, device) first,
        and the trial it repeats, if any."""
        full = {"driver": self.driver, "host": self.host, "pid": self.pid,
                "device": self.device, **record}
        if requeued_from is not None:
            full[REQUEUED_FROM] = requeued_from
        return full

    def _unclaim(self, stored_id: int) -> None:
        """Give a claimed trial back to the queue, its claimant's name cleared first: a
        driver that takes it later is not this one, and a claim whose named driver is
        gone is stale at once (:meth:`_silence`)."""
        self.storage.set_trial_user_attr(stored_id, CLAIM_ATTR, "")
        self.storage.set_trial_state_values(stored_id, TrialState.WAITING)

    def _requeue(self, params: dict[str, Any], number: int) -> None:
        # what Study.enqueue_trial writes, through this driver's (timed) storage
        self.storage.create_new_trial(self.study_id, template_trial=optuna.trial.create_trial(
            state=TrialState.WAITING, system_attrs={"fixed_params": params},
            user_attrs={REQUEUED_FROM: number}))

    def _fail_stale(self, t: FrozenTrial, now: float) -> None:
        """Fail another driver's trial whose driver went silent; re-queue it once."""
        record = dict(t.user_attrs.get(RECORD_ATTR, {}))
        again = REQUEUED_FROM not in record and REQUEUED_FROM not in t.user_attrs
        # its parameters are whole once its record is there (written last); a trial
        # killed before that is queued again as an empty slot
        params = dict(t.params) if RECORD_ATTR in t.user_attrs else {}
        silent = self._silence(t, now)
        driver = record.get("driver") or t.user_attrs.get(CLAIM_ATTR) or "(unknown)"
        why = f"its driver {driver} " + (
            "has exited" if silent == float("inf") else
            f"sent no heartbeat for {silent:.0f} s (grace {self.grace:.0f} s)")
        record.update(fail_reason=f"stale: {why}", retried=again, failed_by=self.driver)
        try:
            self.storage.set_trial_user_attr(trial_id(t), RECORD_ATTR, record)
            if not self.storage.set_trial_state_values(trial_id(t), TrialState.FAIL):
                return
        except (UpdateFinishedTrialError, RuntimeError):
            return  # finished meanwhile, or another driver failed it first
        if again:
            self._requeue(params, t.number)

    def _write(self, write: Callable[[], Any]) -> Any:
        """A write on this thread, its failure a :class:`WriteFailed`."""
        try:
            return write()
        except Exception as e:
            raise WriteFailed(_failed(e)) from None

    def check(self) -> None:
        """Raise :class:`WriteFailed` if a write failed."""
        if self.writer.error is not None:
            raise WriteFailed(self.writer.error)

    def flush(self) -> None:
        """Wait for every write so far; raise :class:`WriteFailed` if one failed."""
        self.writer.flush()
        self.check()

    def close(self) -> None:
        """Store this driver's :attr:`storage_time` in the study (the writer's last
        write, itself not counted), wait for every write; raise :class:`WriteFailed` if
        one failed."""
        if self.writer.running():
            self.writer.put(self._store_storage_time)
        self.writer.close()
        self.check()

    def _store_storage_time(self) -> None:
        self.raw_storage.set_study_system_attr(
            self.study_id, STORAGE_TIME_PREFIX + self.driver, self.storage_time.as_dict())


def _failed(e: BaseException) -> str:
    """What a failed storage call means (Optuna's own message hides the cause)."""
    from explore.storages import explain

    return explain(e)


class _Writer:
    """Writes to the storage on a thread of its own, in order, and records the
    driver's heartbeat every :data:`HEARTBEAT_EVERY` seconds.  After a failed write
    it writes nothing more (the rest would fail the same way) and keeps the reason.
    ``inline``: no thread; each write is done when it is put, and the heartbeat when
    one is due at a write or a :meth:`tick` (a simulation's drivers)."""

    def __init__(self, live: LiveStudy, inline: bool = False) -> None:
        self.live = live
        self.queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self.error: str | None = None
        self.beat = 0.0
        self.inline, self.closed = inline, False
        self.thread = threading.Thread(target=self._run, name="explore-study-writer",
                                       daemon=True)
        if not inline:
            self.thread.start()

    def put(self, write: Callable[[], Any]) -> None:
        if self.inline:
            if not self.closed:
                self._inline(write)
        else:
            self.queue.put(write)

    def tick(self) -> None:
        """(inline) The heartbeat, if one is due: what the thread does when idle."""
        if self.inline and not self.closed:
            self._inline(_idle)

    def running(self) -> bool:
        """Whether writes put now are still done."""
        return not self.closed if self.inline else self.thread.is_alive()

    def _inline(self, item: Callable[[], Any]) -> None:
        if self.error is not None:
            return
        was = getattr(_on_writer, "yes", False)
        _on_writer.yes = True  # counted as the writer's calls, as on its thread
        try:
            self._heartbeat()
            item()
        except Exception as e:  # raised by the next check, as the thread's are
            self.error = _failed(e)
        finally:
            _on_writer.yes = was

    def _heartbeat(self) -> None:
        now = self.live.clock()
        if now - self.beat >= self.live.every:
            self.beat = now
            live = self.live
            live.storage.set_study_system_attr(live.study_id, HEARTBEAT_PREFIX + live.driver,
                                               now)

    def _run(self) -> None:
        _on_writer.yes = True  # this thread's storage calls are the writer's
        while True:
            try:
                item = self.queue.get(timeout=self.live.every / 2)
            except queue.Empty:
                item = _idle
            if item is None:
                return
            if self.error is not None:
                if isinstance(item, _Marker):
                    item()
                continue
            try:
                self._heartbeat()
                item()
            except Exception as e:  # re-raised on the scheduler's thread
                self.error = _failed(e)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write put so far is done (or failed)."""
        if self.inline:
            return  # done as they were put
        done = threading.Event()
        self.queue.put(_Marker(done))
        if self.thread.is_alive():
            done.wait(timeout)

    def close(self) -> None:
        if self.inline:
            self.closed = True
        elif self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


class _Marker:
    """A point in the queue that a flush waits for (reached even after a failure)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def __call__(self) -> None:
        self.done.set()


def _idle() -> None:
    """A wake-up with nothing to write: the heartbeat is due."""
