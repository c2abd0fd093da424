"""A deterministic simulation of whole runs: several drivers, each a decision core
(:mod:`.core`) with its simulated workers *and* the study side of a run
(:class:`explore.live.LiveStudy`), on one shared storage that can be slow, fail a
call, and outlive a driver or a worker lost at any step, every choice drawn from one
seed.

It composes the two simulations of each half.  The world is the study's
(:class:`explore.live.simulation.Simulation`: the shared in-memory storage and each
driver's view of it, the virtual clock and the heartbeats it moves, drivers that die,
stall or stop on a failed call, and a *next run* when no driver is left and the study
lacks its total); each driver's run is the scheduler's
(:class:`~.drivers_simulated.DriverRun`, a :class:`.simulation.Simulation`: its core
and workers, messages that cross, workers that die), its trials claimed and asked of
the driver's LiveStudy and ended there as the loop (:mod:`.loop`) and the intake
(:mod:`.intake`) do.  The core is driven only by its events, and its commands are
carried out.

A step picks a driver and one act: claim a trial, or ask one claimed (a group of up to
``stack`` of them is then admitted to the core; while the sampler draws blind, a draw
goes on to several groups, held ahead and released the cheapest first, as the loop's
``_draw``); let its world move (a message
delivered to a worker or to the core, a round run, a worker dead, the processes grown);
kill one of its workers; kill the driver (its heartbeats stop, its workers vanish);
stall it past the grace; fail one of its coming storage calls; Ctrl-C it; or move the
clock.  A storage call may be slow (:class:`~.drivers_simulated.SlowStorage`): other
drivers act before it is done, so claims race as they do between processes; and while
one driver waits for another's claim to be written, the others act
(:meth:`LiveStudy._lost`).

The invariants, after every step (:meth:`DriversSimulation.check`):

- each live core's own (the scheduler simulation's): arena regions that never overlap,
  placed heaps within the budget and within the room grown processes leave, every
  trial in one place (placed, paused, waiting, or ended once), counts that match;
- the study's (the study simulation's, but that Ctrl-C queues even a repeat again):
  its counted trials never exceed its total; every trial is RUNNING, WAITING,
  COMPLETE, PRUNED or FAIL, a FAIL has its reason, and one failed to be re-queued (its
  worker or driver died, Ctrl-C) has exactly one repeat; with a grid sampler no two
  counted trials share their parameters;
- between the two: what a live driver holds (claimed, drawn, drawn ahead, waiting,
  placed or paused) is exactly what the storage has RUNNING under its name, but for trials
  another driver failed as stale while it stalled, so no paused trial is lost; a
  driver that ended or was interrupted leaves nothing RUNNING.

Once every driver has gone, the study simulation's ``check_gone``; at the end, after a
next run if one was needed, the study has its total, nothing RUNNING or queued.  A
broken one raises :class:`Violation` naming the seed and the step, and
``simulate(seed)`` replays the schedule exactly.  Two known gaps of the study side
(:data:`REQUEUE_LOST`, :data:`NAMELESS`) break an invariant in a few schedules: each is
matched by its cause, counted in ``Result.gaps`` and let pass, or raised with
``strict``.

>>> result = simulate(7)
>>> result.counted == result.total and result.steps > 0
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from explore.live import REQUEUED_FROM, LiveStudy, counted
from explore.live import simulation as live_simulation
from explore.live.names import final_record
from explore.live.simulated import EPOCH, MAX_SLEEPS, SIMULATED, Driver
from explore.live.simulation import quiet
from explore.sampling import suggest
from explore.scheduler import simulation as core_simulation
from explore.scheduler.commands import Interrupted, Tick
from explore.scheduler.core import Core
from explore.scheduler.drivers_simulated import (
    ENDED,
    NAMELESS,
    REQUEUE_LOST,
    SURPLUS,
    DriverRun,
    Result,
    SlowStorage,
    owner,
    requeues,
)
from explore.study import PARAMS_ATTR

MAX_STEPS = 5_000  # a schedule not over by then is stuck (the longest of 1,500 took 209)


class Violation(live_simulation.Violation, core_simulation.Violation):
    """An invariant broken: the message names the seed and the step that replay it."""


class DriversSimulation(live_simulation.Simulation):
    """One schedule, drawn from ``seed``; :meth:`run` plays it to the end.
    ``live_type`` and ``core_type`` are the study side and the decisions under test (a
    planted bug's subclass); ``strict``: the known gaps are violations too; ``slow``:
    the chance that a storage call is overtaken by another driver's act; ``ahead``:
    the drivers draw ahead while their sampler draws blind, as the loop does (False:
    one trial at a time, the schedules as they were before the loop did); the other
    arguments are the study simulation's."""

    def __init__(self, seed: int, live_type: type[LiveStudy] = LiveStudy,
                 core_type: type[Core] = Core, strict: bool = False, slow: float = 0.05,
                 ahead: bool = True, **kwargs: Any) -> None:
        self.core_type, self.strict, self.slow, self.ahead = core_type, strict, slow, ahead
        # what replays it, beside the seed: the arguments not left to their defaults
        given = {"live_type": live_type, "core_type": core_type, "strict": strict,
                 "slow": slow, "ahead": ahead, **kwargs}
        default = {"live_type": LiveStudy, "core_type": Core, "strict": False, "slow": 0.05,
                   "ahead": True}
        self.replay = "".join(f", {k}={getattr(v, '__name__', None) or repr(v)}"
                              for k, v in given.items() if default.get(k, ...) != v)
        self.gaps: Counter[str] = Counter()  # known gaps met (see _gap), each once
        self._gaps_seen: set[tuple[str, int]] = set()
        self._hidden: set[int] = set()  # stored ids check_gone leaves to its own rule
        self.asking: dict[int, int] = {}  # driver index -> the claim it asks, by number
        self.runs: list[DriverRun] = []  # by driver index (made as each driver is added)
        self.slowed: list[SlowStorage] = []  # each driver's storage, by index
        kwargs.setdefault("max_steps", MAX_STEPS)
        super().__init__(seed, live_type, **kwargs)

    def _where(self, what: str) -> str:
        return f"seed {self.seed}, step {self.step}: {what} " \
            f"(replay: simulate({self.seed}{self.replay}))"

    def _add_driver(self) -> Driver:
        d = super()._add_driver()
        self.runs.append(DriverRun(self, d, self.rng.randrange(1 << 30), self.core_type,
                                   self.rng, ahead=self.ahead))
        self.slowed.append(SlowStorage(d.live.storage, partial(self._slow, d)))
        d.live.storage = cast(BaseStorage, self.slowed[-1])
        return d

    def _slow(self, d: Driver, call: str) -> None:
        """``d``'s storage ``call`` is slow: another driver acts before it is done (its
        own calls may be slow too, three deep at most).  Not by asking a trial: an ask
        may wait for ``d``'s claim, which cannot move until it returns (in a real run
        the two go on side by side); time passing is the stall's part."""
        if not self.mishaps or d not in self.acting or len(self.acting) >= 3 or \
                self.rng.random() >= self.slow:
            return
        choices = [(o, act) for o, act in self._choices(
            [o for o in self.drivers if o.state == "running" and o not in self.acting])
            if act != self._ask]
        if choices:
            self._act(*self.rng.choice(choices))

    def _sleep(self, seconds: float) -> None:
        """The study simulation's (a driver waits for a claim before its own to be
        written; time passes, and another driver may ask meanwhile), but only a claim
        numbered before every one being asked goes ahead: any other might wait for one
        of those, which cannot move until it returns."""
        self.sleeps += 1
        if self.sleeps > MAX_SLEEPS:
            raise Violation(self._where("stuck: a driver waits for ever for a claim"))
        if len(self.acting) < 4 and self.rng.random() < 0.5:
            first = min(self.asking.values(), default=0)
            others = [d for d in self.drivers if d.state == "running" and d.pending
                      and d not in self.acting and d.pending[0].number < first]
            if others:
                self._act(self.rng.choice(others), self._ask)
        self.advance(max(seconds, self.rng.choice([0.01, 0.5, 2.0])))

    # -- a driver acts, as its loop does ----------------------------------------------------
    def _act(self, d: Driver, action: Callable[[Driver], None]) -> None:
        """``d`` does ``action`` in its loop (the time told to its core first; after it,
        unless inside the intake, the rest of the loop's iteration and a read of the
        study); a failed storage call stops it (the study simulation's _act)."""
        run = self.runs[d.index]

        def in_loop(d: Driver) -> None:
            run.now = self.now - EPOCH
            run._deliver(Tick(run.now))
            action(d)
            if d.state == "running" and not run.mid_intake():
                run.after()
                d.live.refresh()
            d.live.check()  # a write that failed stops the run before it goes on

        super()._act(d, in_loop)

    def _claim(self, d: Driver) -> None:
        """The intake claims a trial; none to claim ends its ask, and a driver that then
        holds nothing ends if the study is settled (as the loop does)."""
        run = self.runs[d.index]
        if not run.drawing:  # a draw begins: how many it takes is decided first
            run.begin_draw()
        claim = d.live.claim()
        if claim is not None:
            self.conflicts["past the total"] += self._places() > self.total
            d.pending.append(claim)
            self.runs[d.index].drawing = True
            return
        self._intake_over(d)

    def _ask(self, d: Driver) -> None:
        """The intake asks the trial it claimed (the parameters drawn, checked against
        the claims before it, written); a group complete, or a claim lost, is admitted."""
        run = self.runs[d.index]
        claim = d.pending.pop(0)
        self.asking[d.index] = claim.number
        try:
            trial = d.live.ask(claim, lambda t: suggest(t, self.space))
        finally:
            del self.asking[d.index]
        if trial is None:  # lost to the total or to a grid point taken: the ask ends
            given_up = self.shared.get_trial(claim.stored_id).state == TrialState.FAIL
            self.conflicts["given up" if given_up else "unclaimed"] += 1
            self._intake_over(d)
            return
        run.drawn.append((trial, d.live.requeued(trial)))
        if len(run.drawn) >= run.stack:
            run.admit()

    def _places(self) -> int:
        """The places of the total the study's trials hold: counted, running, queued,
        or failed to be re-queued and not yet (a claim between LiveStudy.finish's two
        writes takes a place its repeat needs)."""
        trials = self.trials()
        repeated = {t.user_attrs.get(REQUEUED_FROM) for t in trials}
        return sum(counted(t) or t.state in (TrialState.RUNNING, TrialState.WAITING) or
                   (requeues(t) and t.number not in repeated) for t in trials)

    def _intake_over(self, d: Driver) -> None:
        run = self.runs[d.index]
        run.admit(end=True)
        if not run.core.holds() and d.live.settled():
            d.live.close()
            self._gone(d, "ended")
            if self.counted() < self.total:
                self.ended_short += 1

    def _work(self, d: Driver) -> None:
        """One thing happens in the driver's world (the scheduler simulation's step): a
        message reaches a worker or the core, a worker runs a round, dies, grows."""
        self.runs[d.index]._act()

    def _interrupt(self, d: Driver) -> None:
        """Ctrl-C: every trial in hand fails and is queued again, the study is closed."""
        run = self.runs[d.index]
        run.interrupted = True
        run._deliver(Interrupted())
        if run.core.holds():
            raise Violation(self._where(f"driver {d.name} holds trials after Ctrl-C"))
        d.live.close()
        self._gone(d, "interrupted")

    def _one(self) -> None:
        """One step: something happens to one driver, or the clock moves."""
        rng = self.rng
        running = [d for d in self.drivers if d.state == "running"]
        roll = rng.random() / self.mishaps if self.mishaps else 1.0
        if roll < 0.003 and running:  # its process is killed: nothing more of it
            self._gone(rng.choice(running), "died")
            return
        if roll < 0.005 and running:  # a storage call slower than the grace
            self.advance(self.grace * rng.choice([1.2, 2.0]), frozen=rng.choice(running))
            return
        if roll < 0.010 and running:  # one of its next storage calls fails
            rng.choice(running).storage.fail_in = rng.randint(1, 8)
            return
        if roll < 0.018:  # at the top of its loop (not inside the intake's ask)
            top = [d for d in running if not self.runs[d.index].mid_intake()]
            if top:
                d = rng.choice(top)
                if rng.random() < 0.25:
                    self._act(d, self._interrupt)
                else:
                    run = self.runs[d.index]
                    i = rng.choice(sorted(run.workers))
                    self._act(d, lambda d: run._died(i))
                return
        choices: list[tuple[Driver, Callable[[Driver], None]] | None] = []
        choices += self._choices(running)
        choices += [None] * max(1, len(running) // 2)  # the clock moves
        choice = rng.choice(choices)
        if choice is None:
            self.advance(rng.choice(self.moves))
        else:
            self._act(*choice)

    def _choices(self, drivers: list[Driver]) -> list[tuple[Driver, Callable[[Driver], None]]]:
        """What ``drivers`` may do in their loops, each act as often as it is likely."""
        out: list[tuple[Driver, Callable[[Driver], None]]] = []
        for d in drivers:
            run = self.runs[d.index]
            if d.pending:
                out += [(d, self._ask)] * 3
            elif run.drawing or (run.asks() and not run.core.ahead):  # else released
                out += [(d, self._claim)] * 3
            if not run.mid_intake() and run._busy():
                out += [(d, self._work)] * 8
        return out

    def _next_step(self) -> None:
        """A step; anything it raises is a violation at this seed and step."""
        try:
            super()._next_step()
        except (live_simulation.Violation, core_simulation.Violation) as e:
            raise Violation(str(e)) from None
        except Exception as e:
            raise Violation(self._where(f"{type(e).__name__}: {e}")) from e

    # -- the invariants ---------------------------------------------------------------------
    def check(self, final: bool = False) -> None:
        trials = self.trials()
        self._check_study(trials, final)
        by_id = {t._trial_id: t for t in trials}
        for d, run in zip(self.drivers, self.runs, strict=True):
            if d.state == "running" and d.live.writer.error is None:
                run.check()  # the core's own invariants
                self._check_held(d, run, by_id)
            elif d.state in ("ended", "interrupted"):
                left = [t.number for t in trials
                        if t.state == TrialState.RUNNING and owner(t) == d.name]
                if left:
                    raise Violation(self._where(f"trials {left} left RUNNING by driver "
                                                f"{d.name}, which {d.state}"))

    def _check_study(self, trials: list[FrozenTrial], final: bool) -> None:
        """The study's invariants (the study simulation's, but that Ctrl-C queues a
        repeat again, and that a trial failed to be re-queued has its repeat)."""
        n = sum(counted(t) for t in trials)
        if n > self.total:
            raise Violation(self._where(f"{n} trials counted, beyond the total {self.total}"))
        by_number = {t.number: t for t in trials}
        repeats = Counter(t.user_attrs[REQUEUED_FROM] for t in trials
                          if REQUEUED_FROM in t.user_attrs)
        points: dict[str, int] = {}
        for t in trials:
            record = final_record(t)
            why = record.get("fail_reason")
            if t.state not in (TrialState.RUNNING, TrialState.WAITING, *ENDED):
                raise Violation(self._where(f"trial {t.number} is {t.state.name}"))
            if t.state == TrialState.FAIL and not why:
                raise Violation(self._where(f"trial {t.number} failed without a reason"))
            if requeues(t) and repeats[t.number] != 1 and \
                    not (repeats[t.number] == 0 and self._gap(REQUEUE_LOST, t)):
                raise Violation(self._where(f"trial {t.number} failed to be re-queued "
                                            f"({why}) has {repeats[t.number]} repeats"))
            source = t.user_attrs.get(REQUEUED_FROM)
            if source is not None:
                first = by_number.get(source)
                if repeats[source] > 1:
                    raise Violation(self._where(f"trial {source} re-queued twice"))
                if first is not None and first.state in ENDED and \
                        not final_record(first).get("retried"):
                    raise Violation(self._where(f"trial {source} re-queued, though it "
                                                "counts"))
                if first is not None and REQUEUED_FROM in first.user_attrs and \
                        final_record(first).get("fail_reason") \
                        != "interrupted":
                    raise Violation(self._where(f"trial {t.number} repeats trial {source}, "
                                                "itself a repeat, not interrupted"))
            if self.sampler == "grid" and counted(t) and PARAMS_ATTR in t.user_attrs:
                key = repr(t.user_attrs[PARAMS_ATTR])
                if key in points:
                    raise Violation(self._where(f"trials {points[key]} and {t.number} both "
                                                "ran one grid point"))
                points[key] = t.number
        if final:
            if n != self.total:
                raise Violation(self._where(f"the study ended with {n} of its {self.total} "
                                            "trials"))
            left = self._left()
            if left:
                raise Violation(self._where(f"trials {[t.number for t in left]} left "
                                            f"{left[0].state.name} at the end"))

    def _gap(self, gap: str, t: FrozenTrial) -> bool:
        """Whether ``t``, which breaks an invariant, does so by the known ``gap``
        (:data:`REQUEUE_LOST`, :data:`NAMELESS`): then it is counted
        in :attr:`gaps` and let pass, unless ``strict``."""
        if self.strict:
            return False
        if gap == REQUEUE_LOST:  # the driver that failed it stopped on the re-queue
            record = final_record(t)
            name = record.get("failed_by") or record.get("driver")
            if not any(d.name == name and d.state == "stopped" and
                       d.storage.failed == "create_new_trial" for d in self.drivers):
                return False
        elif gap == NAMELESS and self._claimant(t) is None:
            return False
        if (gap, t.number) not in self._gaps_seen:
            self._gaps_seen.add((gap, t.number))
            self.gaps[gap] += 1
        return True

    def _claimant(self, t: FrozenTrial) -> Driver | None:
        """The driver that stopped on a failed write to ``t`` (naming it, or clearing
        its name), if any."""
        return next((d for d in self.drivers if d.state == "stopped" and
                     self.slowed[d.index].last[1][:1] == (t._trial_id,)), None)

    def check_gone(self) -> None:
        """The study simulation's, but that a RUNNING trial that names no driver is
        judged as the driver's that stopped writing it (:data:`NAMELESS`): one gone as
        shortly before the last driver ended as any other it trusted."""
        last, nameless = self.last, [t for t in super()._left()
                                     if t.state == TrialState.RUNNING and not owner(t)]
        if last is None or last.state != "ended" or \
                not all(self._gap(NAMELESS, t) for t in nameless):
            super().check_gone()
            return
        for t in nameless:
            d = self._claimant(t)
            assert d is not None and d.gone_at is not None
            if d.gone_at < self.ended_at - 3 * last.live.every:
                raise Violation(self._where(
                    f"the last driver, {last.name}, ended by itself with trial {t.number} "
                    f"running for {d.name}, gone long before"))
        self._hidden = {t._trial_id for t in nameless}
        try:
            super().check_gone()  # the others
        finally:
            self._hidden = set()

    def _left(self) -> list[FrozenTrial]:
        """The study's trials running or queued, but a nameless one while check_gone
        judges it.  Claims that raced past the total leave none: the driver that finds
        the total reached ends what is queued of them (LiveStudy.settled)."""
        return [t for t in super()._left() if t._trial_id not in self._hidden]

    def _check_held(self, d: Driver, run: DriverRun, by_id: dict[int, FrozenTrial]) -> None:
        """What ``d`` holds is what the storage has RUNNING under its name: a trial it
        holds nowhere (a paused one forgotten, say) would run for ever in the study, one
        it holds that the study ended would run twice."""
        held = run.held()
        for sid, t in by_id.items():
            if t.state == TrialState.RUNNING and owner(t) == d.name and sid not in held:
                raise Violation(self._where(f"trial {t.number} is RUNNING for driver "
                                            f"{d.name}, which holds it nowhere"))
        for sid, where in held.items():
            t = by_id[sid]
            stale = t.state == TrialState.FAIL and \
                final_record(t).get("failed_by") not in (None, d.name)
            if not stale and (t.state != TrialState.RUNNING or owner(t) != d.name):
                raise Violation(self._where(f"trial {t.number}, {where} by driver {d.name}, "
                                            f"is {t.state.name} for {owner(t)!r} in the "
                                            "study"))

    def result(self) -> Result:  # type: ignore[override]
        trials = self.trials()
        events: Counter[str] = Counter()
        for run in self.runs:
            events.update(run.events)
            events["resumed"] += run.core.counts["resumed"]
            events["regrouped"] += run.core.counts.get("regrouped", 0)
            events["repeats"] += len(run.repeats)
        events["stale found"] = len(self.detect)
        # a stalled driver's writes to its trials that another failed as stale meanwhile
        events["writes dropped"] = sum(d.live.writer.taken_over for d in self.drivers)
        events.update(self.conflicts)
        # places left queued by claims past the total, ended once the total was in
        events["surplus ended"] = sum(str(final_record(t).get("fail_reason")).startswith(SURPLUS)
                                      for t in trials if t.state == TrialState.FAIL)
        gone = Counter(d.state for d in self.drivers if d.state != "stopped")
        gone.update(f"stopped: {why}" for why in self.result_stops())
        return Result(self.seed, self.sampler, self.n_drivers, self.total, self.step,
                      len(trials), sum(counted(t) for t in trials),
                      dict(sorted(Counter(t.state.name for t in trials).items())),
                      dict(sorted(gone.items())), self.next_run, dict(sorted(events.items())),
                      dict(sorted(self.gaps.items())), self.unexplained)

    def result_stops(self) -> list[str]:
        """Why drivers stopped: a storage call that failed (injected: "storage
        failed")."""
        return ["storage failed" if SIMULATED in d.why else d.why
                for d in self.drivers if d.state == "stopped"]


def simulate(seed: int, live_type: type[LiveStudy] = LiveStudy, core_type: type[Core] = Core,
             strict: bool = False, slow: float = 0.05, **kwargs: Any) -> Result:
    """Play the schedule of ``seed`` to its end, checking the invariants after every
    step; raises :class:`Violation` with the seed and step where one breaks (where a
    known gap breaks one too, with ``strict``)."""
    with quiet():
        try:
            sim = DriversSimulation(seed, live_type, core_type, strict, slow, **kwargs)
            return cast(Result, sim.run())  # the study simulation's run, our result()
        except (live_simulation.Violation, core_simulation.Violation) as e:
            if isinstance(e, Violation):
                raise
            raise Violation(str(e)) from None
