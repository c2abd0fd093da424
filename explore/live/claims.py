"""Claiming a trial of a shared study: one queued in the storage or a new one, its
parameters drawn and checked against the claims before it (the study's total, and for
a grid the points other drivers hold), written with the driver's record; a claim that
lost is given back.  A part of :class:`~explore.live.study.LiveStudy`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from explore.live.names import (
    CLAIM_ATTR,
    GAVE_UP,
    PARAMS_ATTR,
    RECORD_ATTR,
    REQUEUED_FROM,
    Claim,
    Ours,
    WriteFailed,
    counted,
)
from explore.live.writer import _failed
from explore.optuna_adapter import grid_points, trial_id
from explore.study import make_sampler

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

    from explore.space import Space
    from explore.storages.files import StorageFile


class Claiming:
    """The claims of a :class:`~explore.live.study.LiveStudy` (a mixin of it)."""

    if TYPE_CHECKING:  # what the claims read of the LiveStudy they are a part of
        clock: Callable[[], float]
        sleep: Callable[[float], None]
        driver: str
        every: float
        held: dict[str, Any] | None
        our_ids: set[int]
        ours: dict[int, Ours]
        space: Space
        storage: BaseStorage
        study_id: int
        total: int
        unique: bool
        view: list[FrozenTrial]
        work: optuna.Study
        wstorage: BaseStorage
        file: StorageFile | None

        def refresh(self, force: bool = False) -> None: ...
        def counts(self) -> tuple[int, int]: ...
        def _silence(self, t: FrozenTrial, now: float) -> float: ...
        def _record(self, record: dict[str, Any], requeued_from: int | None
                    ) -> dict[str, Any]: ...
        def _unclaim(self, stored_id: int) -> None: ...
        def _check_ours(self, sid: int, number: int) -> None: ...
        def _settle(self, sid: int, number: int, intended: bool,
                    params: dict[str, Any] | None = None) -> None: ...
        def _write(self, write: Callable[[], Any]) -> Any: ...

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
                raise WriteFailed(_failed(e, self.file)) from None
            if taken:  # ours: no other driver's change from WAITING succeeded
                # named as ours, as a new claim is: the others judge it by this driver's
                # heartbeats, not by when it was taken, while its parameters are drawn
                sid = trial_id(t)
                try:
                    self._write(partial(self.storage.set_trial_user_attr, sid, CLAIM_ATTR,
                                        self.driver))
                except UpdateFinishedTrialError:  # failed meanwhile (as stale): not ours
                    return None  # the next claim reads the study again
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
                self._give_up(claim, f"{GAVE_UP} ran meanwhile as another trial",
                              claim.fixed)
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
            self._check_ours(sid, claim.number)  # not over a stale verdict's copy
            self.storage.set_trial_user_attr(sid, RECORD_ATTR, record)

        try:
            self._write(write)
        except UpdateFinishedTrialError:  # this driver stalled: another failed the claim
            self.work.tell(trial, state=TrialState.FAIL)  # as stale (or is failing it)
            self.our_ids.discard(sid)
            with contextlib.suppress(UpdateFinishedTrialError):
                self._write(lambda: self._end_condemned(sid, claim.number))
            return None
        other = self._same_point(claim.number, params) if self.unique else None
        if other is not None:
            # Written at the same moment as another claim of the point, which the check
            # above could not see: a claim taken from the queue has an early number, so
            # claims after it did not wait for it, nor it for them.  Both writes are in
            # now; each side that sees the other gives way (both may: the point is then
            # drawn again once the grid looks exhausted, see _free_point).
            self.work.tell(trial, state=TrialState.FAIL)
            self.our_ids.discard(sid)
            self._give_up(claim, f"{GAVE_UP} was claimed at the same time by trial {other}",
                          dict(frozen.params), record)
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

    def _end_condemned(self, sid: int, number: int) -> None:
        """Fail this driver's trial ``sid`` that another found stale, if that driver
        has not yet (it writes its verdict first and the state last, and may stop in
        between): a trial its owner gives up must not stay RUNNING under the owner's
        name, which its heartbeats would keep from turning stale.  Its repeat is queued
        as the verdict says (:meth:`_settle`)."""
        if self.storage.set_trial_state_values(sid, TrialState.FAIL):
            self._settle(sid, number, True)

    def _give_up(self, claim: Claim, why: str, params: dict[str, Any],
                 record: dict[str, Any] | None = None) -> None:
        """End ``claim`` (its point ``params``) as a failure that does not count towards
        the total and is owed no repeat (``why`` begins with :data:`GAVE_UP`); but if a
        driver that found it stale wrote its verdict over this record, the verdict's
        repeat is queued (:meth:`LiveStudy._settle`)."""
        full = {**(record or self._record({}, claim.requeued_from)),
                "fail_reason": why, "retried": True}

        def write() -> None:
            self.storage.set_trial_user_attr(claim.stored_id, RECORD_ATTR, full)
            self.storage.set_trial_state_values(claim.stored_id, TrialState.FAIL)
            self._settle(claim.stored_id, claim.number, False, params)

        with contextlib.suppress(UpdateFinishedTrialError):  # failed as stale meanwhile
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

    @staticmethod
    def _holds(t: FrozenTrial, number: int) -> bool:
        """Whether trial ``t`` holds a place of the total that claim ``number`` may not
        take.  One that counts, whatever its number: a trial taken from the queue keeps
        its early number, so a claim numbered after it may have ended before it checks.
        One whose claim passed this check, its record written, whatever its number too:
        a claim before this one that it did not wait for (its driver silent) may check
        after this one.  A claimed repeat, whatever its number, record or not: it counts
        however it ends, even failed as stale before its record (a repeat is not queued
        again), so neither a claim that did not wait for it (its driver silent) nor one
        that it would have waited for (had its driver not gone quiet first) may take
        its place."""
        if counted(t):
            return True
        return t.state == TrialState.RUNNING and t.number != number and (
            RECORD_ATTR in t.user_attrs or REQUEUED_FROM in t.user_attrs)

    def _lost(self, number: int, params: dict[str, Any]) -> str | None:
        """Why claim ``number`` must give way, or None: "total" if the trials that hold
        a place ahead of it (:meth:`_holds`: ended and counted, or running past this
        check) reach the study's total, "duplicate" if (grid search) one of them has the
        same ``params``.  Waits (30 s at most) for the parameters of claims before it
        that are being written."""
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
        if sum(self._holds(t, number) for t in self.view) >= self.total:
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
