"""One driver of :mod:`.drivers_simulation`: the scheduler's simulated run
(:class:`explore.scheduler.simulation.Simulation`: a decision core, its simulated
workers, messages that cross, workers that die) whose trials come from, and end in, a
real :class:`~explore.live.LiveStudy` on the drivers' shared storage, as the loop
(:mod:`.loop`) and the intake (:mod:`.intake`) connect them:

- the intake claims and asks trials one by one (``stack`` of them at most), then
  admits them to the core: stacked, alone, or failed before they start when they do
  not fit an arena (:meth:`DriverRun.admit`);
- the core's commands are carried out as the loop does: a launch is noted in the
  trial's record and written (:meth:`LiveStudy.record`), a note collects the record an
  end writes, a tell ends the trial in the study (:meth:`LiveStudy.finish`, re-queued
  when its worker died or Ctrl-C);
- after each of its acts the driver does what the loop's iteration does after the
  intake: the lockstep's next word, placement, Idle when only paused trials are held
  and nothing can promote them (:meth:`DriverRun.after`).

Beside it: the storage whose calls may be slow (:class:`SlowStorage`), a schedule's
:class:`Result`, and the study side's known gaps, each a pair of writes that belong
together and that a failure can come between (:data:`REQUEUE_LOST`, :data:`NAMELESS`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from optuna.trial import FrozenTrial, Trial, TrialState

from engine.alignment import align_up
from explore.live import CLAIM_ATTR
from explore.live.simulated import Driver
from explore.optuna_adapter import trial_id
from explore.scheduler.commands import Idle, Launch, Moved, Note, Send, Tell
from explore.scheduler.core import Core
from explore.scheduler.protocol import Pause
from explore.scheduler.simulated import SimPolicy, SimTrial
from explore.scheduler.simulation import Simulation
from explore.study import RECORD_ATTR

if TYPE_CHECKING:
    from explore.scheduler.drivers_simulation import DriversSimulation


# -- the study's records, as the checks read them --------------------------------
ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# A claim given up in LiveStudy.ask (its grid point taken meanwhile) fails as "retried"
# so that it is not counted, but it never ran: nothing is queued for it.
GAVE_UP = "its grid point"
# A place left queued once the study had its total is ended so by LiveStudy.settled: it
# never ran, and is owed no repeat either.
SURPLUS = "surplus"
# Known gaps: a storage failure between two writes of the study side that belong
# together.
# LiveStudy.finish (and _fail_stale) write a trial FAIL "retried", then queue its repeat
# in a call of its own: a failure between the two loses the repeat (its parameters
# never run again; the total is still reached, by a new trial).
REQUEUE_LOST = "re-queue lost to a failed write"
# Claiming.claim takes a queued trial (RUNNING), then writes the driver's name on it in
# a call of its own (and LiveStudy._unclaim clears the name, then queues the trial): a
# failure between the two leaves a trial RUNNING that names no driver, judged by its
# start (failed as stale only after the grace, even on the same host).
NAMELESS = "a taken trial left nameless by a failed write"


def requeues(t: FrozenTrial) -> bool:
    """Whether ``t`` failed to be re-queued (its worker or driver died, or Ctrl-C)."""
    record = t.user_attrs.get(RECORD_ATTR, {})
    return t.state == TrialState.FAIL and bool(record.get("retried")) and \
        not str(record.get("fail_reason")).startswith((GAVE_UP, SURPLUS))


def owner(t: FrozenTrial) -> Any:
    """The driver a stored trial runs for: its record's, or its claim's until then."""
    return t.user_attrs.get(RECORD_ATTR, {}).get("driver") or t.user_attrs.get(CLAIM_ATTR)


@dataclass(frozen=True)
class StudyTrial(SimTrial):
    """A trial as this driver's core holds it: numbered in the order it was admitted
    (the scheduler simulation's checks count trials 0, 1, ...; the working copy's
    numbers also count the other drivers' trials mirrored there), with the working
    copy's :class:`optuna.trial.Trial` that the study side ends."""

    trial: Trial = field(compare=False)


class StudyPolicy(SimPolicy):
    """The simulated pruner, which also reports each round to the working copy's trial,
    as :class:`~.policy.OptunaPolicy` does: the values its end writes to the study."""

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Any:
        trial.trial.report(measured["score"], round)
        return super().report(trial, round, measured, heap)


class DriverRun(Simulation):
    """The core and workers of ``driver`` (whose :class:`~explore.live.LiveStudy` it
    asks and tells) in ``world``; the shape of the run (workers, arenas, rounds, stack,
    pruner) drawn from ``seed``, every later choice from ``rng``, the world's one
    stream.  ``core_type``: the decisions under test (a planted bug's subclass)."""

    def __init__(self, world: DriversSimulation, driver: Driver, seed: int,
                 core_type: type[Core], rng: random.Random, ahead: bool = True) -> None:
        super().__init__(seed, core_type, knobs=False)  # the loop's defaults
        self.world, self.driver, self.live = world, driver, driver.live
        self.rng = rng  # one stream for the whole world: one seed replays it all
        # the core was made with the plain SimPolicy, before any event: the same pruner,
        # which also reports to the working copy (what the trial's end writes)
        self.policy = self.core.policy = StudyPolicy(seed, self.policy.gated)
        # the loop's trials_per_worker: the driver's capacity, one in lockstep
        self.per_worker = 1 if self.core.lockstep else driver.capacity
        self.interrupted = False
        # the sampler's blind draws, which the loop draws ahead of placing them (a
        # stream of its own: the world's stays as it was for every seed); ``ahead``
        # False: none, one trial at a time
        self.blind = random.Random(seed * 41 + 3).choice([0, 0, 3, 10, None]) \
            if ahead else 0
        self.drawn_now = 0  # trials admitted in the present draw (the loop's _draw)
        self.drawing = False  # inside the intake's ask: claiming up to `stack` trials
        self.drawn: list[tuple[Trial, bool]] = []  # asked, not yet admitted
        self.notes: dict[int, dict[str, Any]] = {}  # the loop's records, by number
        self.events: dict[str, int] = dict.fromkeys(("paused", "worker died", "drawn ahead"), 0)

    def _where(self, what: str) -> str:
        # the world's seed and step, which replay it, not this run's own seed
        return self.world._where(f"driver {self.driver.name}: {what}")

    # -- the intake ---------------------------------------------------------------------
    def mid_intake(self) -> bool:
        """Whether the driver is inside the intake's ask (it claims or asks a trial of
        a group): the loop does nothing else until it returns."""
        return self.drawing or bool(self.driver.pending)

    def asks(self) -> bool:
        """Whether the loop asks for a trial now: nothing waits for room and the
        workers hold fewer than ``per_worker`` trials each that are not paused."""
        return not self.core.waiting and \
            self.core.in_hand() < self.per_worker * len(self.core.workers)

    def begin_draw(self) -> None:
        """The loop's draw begins (:meth:`.loop.Scheduler._draw`): how many trials it
        draws, more than one (held ahead, then released the cheapest first) while the
        sampler draws blind."""
        self.want = self.core.draw_size(self.blind, sum(self.live.counts()),
                                        len(self.core.workers), self.live.unclaimed())
        self.drawn_now = 0

    def admit(self, end: bool = False) -> None:
        """The intake returns what it drew (as :meth:`.intake.Intake.ask`): a stack
        compiled to fit an arena, or each trial alone; one that fits no arena fails
        before it starts.  The loop then places what waits.  The draw goes on with
        another ask until it has its ``want`` (or ``end``: the ask found nothing more,
        or the blind draws were taken meanwhile)."""
        group: list[tuple[StudyTrial, bool]] = []
        for trial, requeued in self.drawn:
            t = StudyTrial(self.asked, trial)
            self.asked += 1
            if requeued:
                self.repeats.add(t.number)
            group.append((t, requeued))
        self.drawn = []
        self.drawn_now += len(group)
        if self.want > 1:
            self.events["drawn ahead"] += len(group)
        taken = self.blind is not None and sum(self.live.counts()) >= self.blind
        self.drawing = not end and self.drawn_now < self.want and not taken
        self._admit(group)
        self._carry(self.core.place())

    # -- the loop -----------------------------------------------------------------------
    def after(self) -> None:
        """The rest of the loop's iteration: the lockstep's next word, placement, and
        Idle when only paused trials are held and nothing runs or is on its way; first,
        while it would ask, what was drawn ahead is released, the cheapest first."""
        while self.core.ahead and self.asks():
            self._release()
            self._carry(self.core.place())
        self._carry(self.core.go())
        self._carry(self.core.place())
        if self.core.holds() and not self._busy() and self.core.idle():
            self._deliver(Idle())
            self._carry(self.core.place())

    def _carry(self, commands: list[Any]) -> None:
        """The loop's part (:meth:`.loop.Scheduler._do`) that touches the study, then
        the simulated workers' (the scheduler simulation's: launches, sends, tells)."""
        for c in commands:
            if isinstance(c, Launch):  # the loop notes and writes where it goes first
                for t in c.pending.trials:
                    self._note(t, {"worker": c.worker, "arena_offset": c.offset,
                                   "total_bytes": align_up(c.program.total_bytes)},
                               write=True)
            elif isinstance(c, Note):
                self._note(c.trial, c.values, write=c.write, ending=c.ending)
            elif isinstance(c, Moved):
                self.notes.setdefault(c.number, {}).setdefault("moves", []).append(c.move)
            elif isinstance(c, Send) and isinstance(c.msg, Pause):
                self.events["paused"] += 1
        super()._carry(commands)

    def _note(self, t: StudyTrial, values: dict[str, Any], write: bool = False,
              ending: bool = False) -> None:
        record = self.notes.setdefault(t.number, {})
        record.update(values)
        if write or ending:  # the working copy's record: what the trial's end writes
            t.trial.set_user_attr(RECORD_ATTR, record)
        if write and not ending:
            self.live.record(t.trial, record)

    def _told(self, c: Tell) -> None:
        super()._told(c)  # counted, and a repeat never re-queued (but on Ctrl-C)
        self.live.finish(c.trial.trial, c.values, state=c.state, retry=c.retry)

    def _died(self, index: int) -> None:
        if index in self.core.workers and self.workers[index].alive:
            self.events["worker died"] += 1
        super()._died(index)

    # -- what the checks read ------------------------------------------------------------
    def held(self) -> dict[int, str]:
        """The stored ids of the trials this driver holds, each with where: claimed and
        not yet asked, asked and not yet admitted, drawn ahead, waiting for room, placed
        (paused or not) in a worker, or switched out of every arena."""
        ours = self.live.ours
        out = {c.stored_id: "claimed" for c in self.driver.pending}
        out.update((ours[trial_id(t)].stored_id, "drawn") for t, _ in self.drawn)
        for where, pends in (("ahead", self.core.ahead), ("waiting", self.core.waiting)):
            for pend in pends:
                out.update((ours[trial_id(t.trial)].stored_id, where) for t in pend.trials)
        for w in self.core.workers.values():
            out.update((ours[trial_id(cast(StudyTrial, p.trial).trial)].stored_id,
                        "paused" if p.paused is not None else "placed")
                       for p in w.residents.values())
        out.update((ours[trial_id(cast(StudyTrial, p.trial).trial)].stored_id, "out")
                   for p in self.core.out.values())
        return out


class SlowStorage:
    """A driver's storage (:attr:`LiveStudy.storage`) whose calls may be slow: before
    each is passed on, ``meanwhile`` may let the other drivers act (their claims, say,
    written between this driver's read of the study and its own claim).  ``last``: the
    last call, its name and arguments (the one that failed, when the driver stopped)."""

    def __init__(self, storage: Any, meanwhile: Callable[[str], None]) -> None:
        self._storage, self._meanwhile = storage, meanwhile
        self.last: tuple[str, tuple[Any, ...]] = ("", ())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._storage, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._meanwhile(name)
            self.last = (name, args)
            return attr(*args, **kwargs)

        setattr(self, name, call)  # looked up once per name
        return call


@dataclass
class Result:
    seed: int
    sampler: str
    drivers: int  # the drivers drawn (a next run's not included)
    total: int
    steps: int
    trials: int  # the study's trials at the end (repeats and given-up claims included)
    counted: int  # those counted towards the total: the total, at the end
    states: dict[str, int]  # the study's trials at the end, by state
    gone: dict[str, int]  # the drivers by how they went: ended, died, stopped, interrupted
    next_run: bool  # whether a next run was needed to bring the study to its total
    events: dict[str, int]  # what the schedule reached (pauses, deaths, repeats, ...)
    gaps: dict[str, int]  # known gaps met and let pass (drivers_simulation.REQUEUE_LOST, ...)
    unexplained: list[str]  # storage failures that reached a driver not as WriteFailed

