"""One driver's view of a shared study: :class:`LiveStudy`, the facade of the study
side (the package's docstring says how drivers cooperate)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from explore.live import timing
from explore.live.claims import Claiming
from explore.live.names import (
    CLAIM_ATTR,
    FLAT,
    GRACE,
    HEARTBEAT_EVERY,
    HEARTBEAT_PREFIX,
    REFRESH_EVERY,
    REQUEUED_FROM,
    STALE_ATTR,
    STORAGE_TIME_PREFIX,
    SURPLUS,
    Ours,
    WriteFailed,
    counted,
    driver_host_pid,
    driver_name,
    owes_repeat,
)
from explore.live.timing import StorageTime, _Timed
from explore.live.writer import _failed, _Writer
from explore.optuna_adapter import storage_of, study_id, trial_id
from explore.procmem import alive as process_alive
from explore.space import Space
from explore.storages.files import StorageFile
from explore.study import PARAMS_ATTR, RECORD_ATTR, Keep, make_pruner, make_sampler


@contextlib.contextmanager
def _quiet_in_memory() -> Iterator[None]:
    """Within, the in-memory storage's log of this thread is dropped: Optuna says "A new
    study created in memory with name: ..." for the working copy, beside its line for
    the stored study, which is the one a user means.  Other threads' records, and
    every other logger's (the stored study's creation included), pass."""
    me = threading.get_ident()
    logger = logging.getLogger(optuna.storages.InMemoryStorage.__module__)

    def others(record: logging.LogRecord) -> bool:
        return record.thread != me

    logger.addFilter(others)
    try:
        yield
    finally:
        logger.removeFilter(others)


class LiveStudy(Claiming):
    """The stored study ``stored`` shared with any other drivers, and the working copy
    :attr:`work` that this driver's sampler and pruner consult.  ``total``: the study's
    ``budget.trials``; ``grace``: seconds without a heartbeat after which another
    driver's running trials are stale.

    What the driver reads of the world can be given, for a deterministic simulation of
    several drivers (:mod:`explore.live.simulation`); the defaults are the real ones.
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
        self.file = StorageFile.of(self.raw_storage)  # deleted under the run: it stops
        self.study_id = study_id(stored)
        # The stored study's name: Hyperband assigns a trial to a bracket by a hash of
        # the study's name and the trial's number, and an unnamed study gets a random one.
        with _quiet_in_memory():
            self.work = optuna.create_study(study_name=stored.study_name,
                                            directions=list(stored.directions),
                                            sampler=make_sampler(space),
                                            pruner=make_pruner(space))
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
            raise WriteFailed(_failed(e, self.file)) from None
        for t in self.view:
            if trial_id(t) not in self.our_ids:
                self._mirror(t)
        if now - self.beats_at >= self.every or force:
            self.beats_at = now
            lost = self.file.lost() if self.file is not None else None
            if lost is not None:
                raise WriteFailed(lost)
            try:
                attrs = self.storage.get_study_system_attrs(self.study_id)
            except Exception as e:
                raise WriteFailed(_failed(e, self.file)) from None
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
        """Whether this driver, holding no trial, may end: the study has its total.
        While other drivers' trials run, it waits for them to end rather than leave: one
        of them may yet fail and be queued again (its driver stopped with Ctrl-C, its
        worker killed, its driver gone quiet until the trial turns stale), and this
        driver then runs the repeat.  Ending on "live drivers will finish them" left such
        a repeat queued with no driver to run it when the other driver's writes were
        late (a loaded machine, a journal's lock)."""
        self.refresh(force=True)  # an end decided on a stale view could leave trials queued
        done, _ = self.counts()
        if done < self.total:
            return False
        self._end_surplus()
        return True

    def _end_surplus(self) -> None:
        """End the places left queued once the study has its total: claims that raced
        past the total (two drivers claiming its last place at once, one reading between
        the two writes of another's :meth:`finish`) hold more places than the total, and
        what is left of them once it is reached (a claim given back, a repeat whose place
        another trial took, or one queued as this very read failed a stale trial) would
        stay WAITING for ever.  Each is taken as a claim takes a queued trial (from
        WAITING, atomically: one another driver took meanwhile is that driver's, which
        gives it back to the total and ends it when it settles in turn), then fails
        "retried" with a :data:`SURPLUS` reason: not counted, owed no repeat.

        Only the queue's own places: a given-back claim without fixed parameters, or a
        repeat.  A trial a user queued (``study.enqueue_trial``) stays for a later run
        with a larger total.  The study's count is final (a trial that counts has
        finished), so none of these can be needed any more."""
        try:  # read afresh: the read that found the total may have queued a repeat
            # (all of them: Optuna's in-memory storage answers a read of the WAITING
            # trials from past the last it saw waiting, so misses a claim given back)
            trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        except Exception as e:
            raise WriteFailed(_failed(e, self.file)) from None
        for t in trials:
            if t.state != TrialState.WAITING or not (REQUEUED_FROM in t.user_attrs or
                    (CLAIM_ATTR in t.user_attrs and not t.system_attrs.get("fixed_params"))):
                continue
            sid = trial_id(t)
            record = {**t.user_attrs.get(RECORD_ATTR, {}), "retried": True,
                      "failed_by": self.driver,
                      "fail_reason": f"{SURPLUS}: queued when the study reached its total of "
                                     f"{self.total} trials (claims of its last places raced)"}

            def end(sid: int = sid, record: dict[str, Any] = record) -> None:
                try:
                    taken = self.storage.set_trial_state_values(sid, TrialState.RUNNING)
                except (UpdateFinishedTrialError, KeyError):
                    taken = False  # finished or taken meanwhile
                if taken:
                    self.storage.set_trial_user_attr(sid, RECORD_ATTR, record)
                    self.storage.set_trial_state_values(sid, TrialState.FAIL)

            self._write(end)

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
            self._check_ours(sid, ours.number)  # not over a stale verdict's copy
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
        queued (once, unless it was interrupted: then always).  A driver that found the
        trial stale may write its verdict meanwhile: whichever of the two sets the state
        queues the repeat the trial as it ended is owed (:meth:`_settle`)."""
        self.new_params(trial)
        self.work.tell(trial, values, state=state)
        frozen = self.wstorage.get_trial(trial_id(trial))
        ours = self.ours.pop(trial_id(trial))

        def write() -> None:
            t0 = timing._clock()
            t = keep.before(frozen) if keep is not None else frozen
            self.storage_time.keep_seconds += timing._clock() - t0
            for k, v in t.user_attrs.items():
                if k == RECORD_ATTR:
                    v = self._record({**v, "retried": True} if retry else v,
                                     ours.requeued_from)
                self.storage.set_trial_user_attr(ours.stored_id, k, v)
            for step, v in t.intermediate_values.items():
                if step not in ours.reported:
                    self.storage.set_trial_intermediate_value(ours.stored_id, step, v)
            self.storage.set_trial_state_values(ours.stored_id, t.state, t.values)
            if t.state == TrialState.FAIL:
                self._settle(ours.stored_id, ours.number, retry, frozen.params)
            if keep is not None:
                t0 = timing._clock()
                keep.after(ours.number)
                self.storage_time.keep_seconds += timing._clock() - t0

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
        with contextlib.suppress(UpdateFinishedTrialError):  # failed as stale meanwhile
            self.storage.set_trial_user_attr(stored_id, CLAIM_ATTR, "")
            self.storage.set_trial_state_values(stored_id, TrialState.WAITING)

    def _requeue(self, params: dict[str, Any], number: int) -> None:
        # what Study.enqueue_trial writes, through this driver's (timed) storage
        self.storage.create_new_trial(self.study_id, template_trial=optuna.trial.create_trial(
            state=TrialState.WAITING, system_attrs={"fixed_params": params},
            user_attrs={REQUEUED_FROM: number}))

    def _fail_stale(self, t: FrozenTrial, now: float) -> None:
        """Fail another driver's trial whose driver went silent; re-queue it once.

        That driver may have stalled rather than died, and write to the trial while it
        is failed here; the two writers' protocol:

        - here, the verdict first, under a key of its own (:data:`STALE_ATTR`, which
          names the driver it condemns), then its copy in the record (what the readers
          of a record read), then the state FAIL;
        - the stalled driver reads that key before each record it writes
          (:meth:`_check_ours`), and finding itself condemned drops that write, as it
          drops any write to a trial that has already finished; its result, if it
          sets its trial's state first, stands (this FAIL then fails, and nothing more
          is done here);
        - one writer only sets the state from RUNNING: that one reads the trial as it
          ended, which nothing can change any more, and queues its repeat if it is owed
          one (:meth:`_settle`); a record written over the verdict's copy after all (a
          write that was on its way when the stalled driver read the key) lacks a
          reason, and the readers then take the verdict's (:func:`final_record`).

        So the trial counts, or has exactly one repeat, whichever way the writes fall."""
        record = dict(t.user_attrs.get(RECORD_ATTR, {}))
        again = REQUEUED_FROM not in record and REQUEUED_FROM not in t.user_attrs
        silent = self._silence(t, now)
        named = record.get("driver") or t.user_attrs.get(CLAIM_ATTR)
        driver = named or "(unknown)"
        why = f"its driver {driver} " + (
            "has exited" if silent == float("inf") else
            f"sent no heartbeat for {silent:.0f} s (grace {self.grace:.0f} s)")
        verdict = {"fail_reason": f"stale: {why}", "retried": again,
                   "failed_by": self.driver}
        record.update(verdict)
        sid = trial_id(t)
        try:
            self.storage.set_trial_user_attr(sid, STALE_ATTR, {**verdict, "driver": named})
            self.storage.set_trial_user_attr(sid, RECORD_ATTR, record)
            if not self.storage.set_trial_state_values(sid, TrialState.FAIL):
                return
        except UpdateFinishedTrialError:
            return  # finished meanwhile, or another driver failed it first
        except Exception as e:  # the storage failed: said as such, as every call's is
            raise WriteFailed(_failed(e, self.file)) from None
        self._settle(sid, t.number, again)

    def _check_ours(self, sid: int, number: int) -> None:
        """Raise :class:`UpdateFinishedTrialError` if another driver found this driver's
        trial ``sid`` stale (it stalled past the grace) and is failing it: a record
        written now could stand over the verdict's copy (:meth:`_fail_stale`)."""
        verdict = self.storage.get_trial(sid).user_attrs.get(STALE_ATTR)
        if isinstance(verdict, dict) and verdict.get("driver") == self.driver:
            raise UpdateFinishedTrialError(
                f"trial {number} has already finished for this driver: driver "
                f"{verdict.get('failed_by')} failed it ({verdict.get('fail_reason')})")

    def _settle(self, sid: int, number: int, intended: bool,
                params: dict[str, Any] | None = None) -> None:
        """Trial ``sid`` (``number``), just failed by this driver's write of its state: its
        repeat is queued if the trial as it ended is owed one (:func:`owes_repeat`).
        Only the one writer whose state took reads it so, and nothing changes a finished
        trial: so it is re-queued exactly when it does not count, whichever record
        stands.  ``intended``: whether the record this driver wrote says so, taken if the
        trial cannot be read back.  ``params``: the repeat's; None for those the trial
        ended with, whole once its parameters' user attribute (written after them) is
        there, else none (a claim that stopped before: queued as an empty slot)."""
        try:
            final: FrozenTrial | None = self.storage.get_trial(sid)
        except Exception:  # the read only confirms: what this driver wrote most likely stands
            final = None
        if not (intended if final is None else owes_repeat(final)):
            return
        if params is None:
            params = dict(final.params) if final is not None and \
                PARAMS_ATTR in final.user_attrs else {}
        self._requeue(params, number)

    def _write(self, write: Callable[[], Any]) -> Any:
        """A write on this thread, its failure a :class:`WriteFailed`; but a write to a
        trial that another driver ended meanwhile (it found this one silent past the
        grace, :meth:`_fail_stale`) raises :class:`UpdateFinishedTrialError`, for the
        caller to give the trial up."""
        try:
            return write()
        except UpdateFinishedTrialError:
            raise
        except Exception as e:
            raise WriteFailed(_failed(e, self.file)) from None

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
