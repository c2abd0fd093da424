"""A deterministic simulation of several drivers on one study: the study side of a run
(:class:`explore.live.LiveStudy`) against drivers that claim, ask, report and end
trials, die, stall, and meet a storage that fails, every choice drawn from one seed.

Each simulated driver is a :class:`~explore.live.LiveStudy` of its own (its name, its
process id, its host), on its own view of one shared in-memory storage
(:class:`DriverStorage`: its calls counted by kind, and made to fail on demand).  The
drivers read a virtual clock (:class:`Simulation.clock`), their writes are done inline
and their heartbeats are written whenever the clock moves (what a writer thread does
while its driver works); a driver waiting for another's claim to be written
(:meth:`LiveStudy._lost`) lets the others run meanwhile.  Nothing here reads a clock or
the system's randomness: ``simulate(seed)`` replays a schedule exactly.

A step is one of: a driver claims a trial (or, holding none and finding none to claim,
ends if :meth:`~explore.live.LiveStudy.settled`); asks a claimed trial (its parameters
drawn from a small space: duplicates happen); reports; ends a trial (complete, pruned,
failed for a reason, or failed because its worker died: re-queued unless a repeat);
reads the study; dies (its heartbeats stop, its process is gone); stalls (the clock
moves past ``grace`` without its heartbeats); its storage fails at a coming call (it
stops, as a run does on :class:`~explore.live.WriteFailed`); or the clock moves.  When
no driver is left running and the study lacks its total, *a next run* (a fresh driver,
later) must bring it there.

The invariants, after every step (:meth:`Simulation.check`): the study's counted trials
never exceed its total; every trial is RUNNING, WAITING, COMPLETE, PRUNED or FAIL, and a
FAIL has its reason in its record; a trial is re-queued at most once and a repeat never
again; with a grid sampler no two counted trials share their parameters.  When the
drivers are all gone: no trial runs for a driver that ended, the study has its total if
the last driver ended by itself, and after the next run, if one was needed, it has its
total with nothing running or queued.  A broken one raises :class:`Violation` naming the
seed and the step.

>>> result = simulate(3)
>>> result.counted == result.total and result.steps > 0
True
"""


from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from explore.live import CLAIM_ATTR, REQUEUED_FROM, LiveStudy, WriteFailed, counted
from explore.live.simulated import (
    EPOCH,
    MAX_SLEEPS,
    MAX_STEPS,
    SIMULATED,
    STUDY,
    Driver,
    DriverStorage,
    Result,
    SharedStorage,
    sim_space,
)
from explore.sampling import suggest
from explore.study import PARAMS_ATTR, RECORD_ATTR


class Violation(AssertionError):
    """An invariant broken: the message names the seed that replays it."""


class Simulation:
    """One schedule, drawn from ``seed``; :meth:`run` plays it to the end.  The other
    arguments fix what the seed would otherwise draw (the bench's scale), and
    ``live_type`` is the study side under test (a planted bug's subclass)."""

    def __init__(self, seed: int, live_type: type[LiveStudy] = LiveStudy, *,
                 drivers: int | None = None, total: int | None = None,
                 capacity: int | None = None, sampler: str | None = None,
                 wide: bool = False, grace: float | None = None, mishaps: float = 1.0,
                 one_host: bool | None = None, moves: tuple[float, ...] | None = None,
                 deaths_at: tuple[int, ...] = (),
                 measure: bool = False, check_every: int = 1,
                 max_steps: int = MAX_STEPS) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        self.live_type, self.measure, self.check_every = live_type, measure, check_every
        self.max_steps = max_steps
        self.sampler = sampler or rng.choice(["random", "grid"])
        self.space = sim_space(self.sampler, wide)
        self.n_drivers = drivers or rng.randint(1, 4)
        grid = self.sampler == "grid"
        self.total = total or rng.randint(1, 8 if grid else 12)
        self.grace = grace or rng.choice([4.0, 20.0, 60.0])
        self.capacity = capacity
        self.mishaps = mishaps  # a factor on deaths, stalls and failures
        self.deaths_at = set(deaths_at)  # steps at which a driver dies, besides
        # how far the clock moves in a step of its own
        self.moves = moves or (0.05, 0.5, 1.0, 3.0, self.grace / 2, self.grace * 1.5)
        # all drivers on one host (a dead one's pid is seen gone at once), or each its own
        self.one_host = rng.random() < 0.5 if one_host is None else one_host
        self.now = EPOCH
        self.step = self.sleeps = 0
        self.acting: list[Driver] = []  # the drivers in a call, innermost last
        self.conflicts: Counter[str] = Counter()
        self.unexplained: list[str] = []
        self.detect: list[float] = []
        self.ended_short = 0
        self.next_run = False
        self.last: Driver | None = None  # the last driver to go
        self.ended_at = EPOCH
        self.shared = SharedStorage(self.clock, self._stale)
        optuna.create_study(storage=self.shared, study_name=STUDY, direction="maximize",
                            sampler=optuna.samplers.RandomSampler(0))
        self.drivers: list[Driver] = []
        for _ in range(self.n_drivers):
            self._add_driver()

    def clock(self) -> float:
        return self.now

    def _where(self, what: str) -> str:
        return f"seed {self.seed}, step {self.step}: {what} (replay: simulate({self.seed}))"

    # -- the world ----------------------------------------------------------------------
    def _add_driver(self) -> Driver:
        i = len(self.drivers)
        host, pid = ("sim" if self.one_host else f"sim{i}"), 1000 + i
        name = f"{host}:{pid}:d{i}"
        storage = DriverStorage(self.shared, self.measure)  # type: ignore[abstract]
        stored = optuna.load_study(study_name=STUDY, storage=storage,
                                   sampler=optuna.samplers.RandomSampler(0))
        live = self.live_type(stored, self.space, total=self.total, device="cpu",
                              grace=self.grace, clock=self.clock, sleep=self._sleep,
                              alive=self._alive, driver=name, inline=True)
        capacity = self.capacity or self.rng.choice([1, 1, 2, 3])
        d = Driver(i, name, pid, storage, live, capacity)
        self.drivers.append(d)
        return d

    def _alive(self, pid: int) -> bool:
        """Whether the process ``pid`` lives (pids are not reused here)."""
        return any(d.pid == pid and d.state == "running" for d in self.drivers)

    def _stale(self, driver: str | None) -> None:
        """A trial of ``driver`` failed as stale: the first of a gone driver's times
        from its end to its detection."""
        for d in self.drivers:
            if d.name == driver and d.gone_at is not None and not d.detected:
                self.detect.append(self.now - d.gone_at)
                d.detected = True  # the first only

    def advance(self, seconds: float, frozen: Driver | None = None) -> None:
        """Time passes; each running driver's writer beats when a beat is due (but
        ``frozen``'s, a driver stalled)."""
        self.now += seconds
        for d in self.drivers:
            if d.state == "running" and d is not frozen:
                d.live.writer.tick()

    def _sleep(self, seconds: float) -> None:
        """A driver waits for a claim before its own to be written: time passes (more
        than asked, as on a busy machine) and another driver may write its claim."""
        self.sleeps += 1
        if self.sleeps > MAX_SLEEPS:
            raise Violation(self._where("stuck: a driver waits for ever for a claim"))
        if len(self.acting) < 4 and self.rng.random() < 0.5:
            others = [d for d in self.drivers if d.state == "running" and d.pending
                      and d not in self.acting]
            if others:
                self._act(self.rng.choice(others), self._ask)
        self.advance(max(seconds, self.rng.choice([0.01, 0.5, 2.0])))

    def _gone(self, d: Driver, state: str, why: str = "") -> None:
        d.state, d.why = state, why
        d.gone_at = self.now if state != "ended" else None
        self.last, self.ended_at = d, self.now

    def _act(self, d: Driver, action: Callable[[Driver], None]) -> None:
        """``d`` does ``action``; a failed storage call stops it (as it stops a run)."""
        self.acting.append(d)
        try:
            d.live.check()  # the loop's first act
            action(d)
        except WriteFailed as e:
            self._gone(d, "stopped", str(e))
        except OSError as e:
            if not str(e).startswith(SIMULATED):
                raise
            # the failure reached the driver as itself, not said as a WriteFailed: the
            # run stops all the same (with a traceback)
            self.unexplained.append(f"{str(e)[len(SIMULATED):]} raised {type(e).__name__}")
            self._gone(d, "stopped", str(e))
        finally:
            self.acting.pop()

    # -- what a driver does ---------------------------------------------------------------
    def _claim(self, d: Driver) -> None:
        claim = d.live.claim()
        if claim is not None:
            d.pending.append(claim)
        elif not d.pending and not d.held and d.live.settled():
            d.live.close()
            self._gone(d, "ended")
            if self.counted() < self.total:
                self.ended_short += 1

    def _ask(self, d: Driver) -> None:
        claim = d.pending.pop(0)
        trial = d.live.ask(claim, lambda t: suggest(t, self.space))
        if trial is not None:
            d.held.append(trial)
            return
        stored = self.shared.get_trial(claim.stored_id)
        self.conflicts["given up" if stored.state == TrialState.FAIL else "unclaimed"] += 1

    def _report(self, d: Driver) -> None:
        trial = self.rng.choice(d.held)
        step = len(d.live.ours[trial._trial_id].reported) + 1
        value = self.rng.random()
        trial.report(value, step)
        d.live.report(trial, step, value)

    def _finish(self, d: Driver) -> None:
        trial = d.held.pop(self.rng.randrange(len(d.held)))
        roll = self.rng.random()
        if roll < 0.6:
            trial.set_user_attr(RECORD_ATTR, {"rounds": 2})
            d.live.finish(trial, self.rng.random())
        elif roll < 0.75:
            trial.set_user_attr(RECORD_ATTR, {"rounds": 1})
            d.live.finish(trial, state=TrialState.PRUNED)
        elif roll < 0.87:
            trial.set_user_attr(RECORD_ATTR, {"fail_reason": "diverged: simulated"})
            d.live.finish(trial, state=TrialState.FAIL)
        else:  # its worker died: queued again, unless it is a repeat (the core's rule)
            trial.set_user_attr(RECORD_ATTR, {
                "fail_reason": f"worker 0 (pid {d.pid * 10}) died with exit code -9"})
            d.live.finish(trial, state=TrialState.FAIL, retry=not d.live.requeued(trial))

    def _refresh(self, d: Driver) -> None:
        d.live.refresh()

    def _one(self) -> None:
        """One step: something happens."""
        rng = self.rng
        running = [d for d in self.drivers if d.state == "running"]
        roll = rng.random() / self.mishaps if self.mishaps else 1.0
        if roll < 0.01 and len(running) > 0:
            self._gone(rng.choice(running), "died")
            return
        if roll < 0.015:  # a driver's machine stalls beyond the grace; it lives on
            self.advance(self.grace * rng.choice([1.2, 2.0]), frozen=rng.choice(running))
            return
        if roll < 0.025:  # one of the driver's next storage calls fails
            rng.choice(running).storage.fail_in = rng.randint(1, 8)
            return
        choices: list[tuple[Driver | None, Callable[[Driver], None] | None]] = []
        for d in running:
            if not d.pending and len(d.held) < d.capacity:  # one claim asked at a time
                choices += [(d, self._claim)] * 3
            elif not d.held and not d.pending:
                choices.append((d, self._claim))
            if d.pending:
                choices += [(d, self._ask)] * 3
            if d.held:
                choices += [(d, self._report), (d, self._finish), (d, self._finish)]
            choices.append((d, self._refresh))
        choices += [(None, None)] * max(1, len(running) // 2)  # the clock moves
        who, action = rng.choice(choices)
        if who is None or action is None:
            self.advance(rng.choice(self.moves))
        else:
            self._act(who, action)

    # -- a schedule -----------------------------------------------------------------------
    def run(self) -> Result:
        while any(d.state == "running" for d in self.drivers):
            self._next_step()
        self.check_gone()
        if self.counted() < self.total or self._left():
            # a next run, later, on one of the hosts: it must bring the study to its total
            self.next_run = True
            self.advance(2 * self.grace)
            self.mishaps = 0.0
            self._add_driver()
            while self.drivers[-1].state == "running":
                self._next_step()
            if self.drivers[-1].state != "ended":
                raise Violation(self._where(f"the next run stopped: {self.drivers[-1].why}"))
        self.check(final=True)
        return self.result()

    def _next_step(self) -> None:
        self.step += 1
        if self.step > self.max_steps:
            raise Violation(self._where("stuck: the drivers never end"))
        running = [d for d in self.drivers if d.state == "running"]
        if self.step in self.deaths_at and len(running) > 1:
            self._gone(self.rng.choice(running), "died")
        else:
            self._one()
        if self.step % self.check_every == 0:
            self.check()

    def result(self) -> Result:
        trials = self.trials()
        states = Counter(t.state.name for t in trials)
        seen: set[str] = set()
        duplicates = 0
        for t in trials:
            if counted(t) and PARAMS_ATTR in t.user_attrs:
                key = repr(t.user_attrs[PARAMS_ATTR])
                duplicates += key in seen
                seen.add(key)
        calls = {d.name: dict(sorted(d.storage.calls.items())) for d in self.drivers}
        size = {"read": sum(d.storage.bytes_read for d in self.drivers),
                "written": sum(d.storage.bytes_written for d in self.drivers),
                "read_cached": sum(d.storage.bytes_cached for d in self.drivers)}
        return Result(self.seed, self.sampler, self.n_drivers, self.total, self.grace,
                      self.step, self.counted(), dict(sorted(states.items())), duplicates,
                      dict(sorted((self.conflicts + Counter(
                          {"writes dropped": sum(d.live.writer.taken_over
                                                 for d in self.drivers)})).items())),
                      sum(d.state in ("died", "stopped") for d in self.drivers),
                      dict(sorted(Counter(
                          "storage failed" if SIMULATED in d.why else d.why
                          for d in self.drivers if d.state == "stopped").items())),
                      self.next_run, self.ended_short, self.detect, self.unexplained, calls,
                      size if self.measure else {})

    # -- the invariants -------------------------------------------------------------------
    def trials(self) -> list[FrozenTrial]:
        return self.shared.get_all_trials(0, deepcopy=False)

    def counted(self) -> int:
        return sum(counted(t) for t in self.trials())

    def _left(self) -> list[FrozenTrial]:
        return [t for t in self.trials() if t.state in (TrialState.RUNNING,
                                                         TrialState.WAITING)]

    def check(self, final: bool = False) -> None:
        trials = self.trials()
        n = sum(counted(t) for t in trials)
        if n > self.total:
            raise Violation(self._where(f"{n} trials counted, beyond the total {self.total}"))
        by_number = {t.number: t for t in trials}
        repeats: Counter[int] = Counter()
        points: dict[str, int] = {}
        for t in trials:
            record = t.user_attrs.get(RECORD_ATTR, {})
            if t.state == TrialState.FAIL and not record.get("fail_reason"):
                raise Violation(self._where(f"trial {t.number} failed without a reason"))
            if t.state not in (TrialState.RUNNING, TrialState.WAITING, TrialState.COMPLETE,
                               TrialState.PRUNED, TrialState.FAIL):
                raise Violation(self._where(f"trial {t.number} is {t.state.name}"))
            source = t.user_attrs.get(REQUEUED_FROM)
            if source is not None:
                repeats[source] += 1
                if repeats[source] > 1:
                    raise Violation(self._where(f"trial {source} re-queued twice"))
                first = by_number.get(source)
                if first is not None and REQUEUED_FROM in first.user_attrs:
                    raise Violation(self._where(
                        f"trial {t.number} repeats trial {source}, itself a repeat"))
            if self.sampler == "grid" and counted(t) and PARAMS_ATTR in t.user_attrs:
                # (a repeat failed as stale before its parameters were written counts
                # without any)
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

    def check_gone(self) -> None:
        """Every driver is gone: none left a trial running if it ended by itself; and if
        the last one to go ended by itself, nothing is queued, and what runs is of
        drivers gone so shortly before that they were not yet quiet (silent for
        ``3 * every`` seconds: :meth:`LiveStudy.settled` trusts them to end their
        trials, and the next run must)."""
        by_name = {d.name: d for d in self.drivers}
        last = self.last
        for t in self._left():
            if t.state == TrialState.WAITING:
                if last is not None and last.state == "ended":
                    raise Violation(self._where(f"trial {t.number} left queued by the last "
                                                f"driver, {last.name}, which ended"))
                continue
            name = t.user_attrs.get(RECORD_ATTR, {}).get("driver") or \
                t.user_attrs.get(CLAIM_ATTR)
            d = by_name.get(name) if isinstance(name, str) else None
            if d is not None and d.state == "ended":
                raise Violation(self._where(f"trial {t.number} runs after its driver "
                                            f"{name} ended"))
            if last is not None and last.state == "ended" and (
                    d is None or d.gone_at is None
                    or d.gone_at < self.ended_at - 3 * last.live.every):
                raise Violation(self._where(
                    f"the last driver, {last.name}, ended by itself with trial {t.number} "
                    f"running for {name}, gone long before"))


@contextmanager
def quiet() -> Iterator[None]:
    """Optuna's messages (a study created, a grid sampler that sees its grid
    exhausted) kept out."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def simulate(seed: int, live_type: type[LiveStudy] = LiveStudy, **kwargs: Any) -> Result:
    """Play the schedule of ``seed`` to its end, checking the invariants after every
    step; raises :class:`Violation` with the seed and step where one breaks."""
    with quiet():
        return Simulation(seed, live_type, **kwargs).run()
