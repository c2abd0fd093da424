"""The :class:`Scheduler`: its settings, and the run's loop, which asks for trials while
there is room and lets the core decide, its parts (:mod:`.startup`, :mod:`.relay`)
carrying the decisions out, until the study has its trials or the run is stopped."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import optuna

from explore.binding import BoundSpace
from explore.datasets import LoadedData
from explore.keeper import ModelKeeper
from explore.live import REFRESH_EVERY, LiveStudy
from explore.scheduler.commands import Admitted, Idle, Interrupted, Tick
from explore.scheduler.core import Core
from explore.scheduler.errors import Stopped
from explore.scheduler.intake import Intake, draws
from explore.scheduler.kernels import for_workers, kernels_of
from explore.scheduler.loop.relay import Relay
from explore.scheduler.peak import gemm_peak
from explore.scheduler.policy import OptunaPolicy
from explore.scheduler.prestart import Prestarted
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.shared_data import share_dataset
from explore.scheduler.signals import StopFlag, catch_stop_signals
from explore.scheduler.stacking import stacks_for
from explore.scheduler.switched import SwitchFolder
from explore.scheduler.telemetry import MemorySampler, Progress, RunStats
from explore.space import Space
from explore.study import blind_draws


def unstacked_because(space: Space, lockstep: bool, rotation: int | None) -> str | None:
    """Why a run of ``space`` stacks no trials whatever ``budget.stack`` says (None: it
    may stack): lockstep, rotation, or objectives with no per-model form."""
    if lockstep:
        return ("a seeded run on one worker trains one trial at a time (lockstep), so "
                "that it repeats its search exactly")
    if rotation is not None:
        return "trials in rotation (budget.in_flight) take their turns one at a time"
    if not stacks_for(space):
        return ("an objective reads sums or rows (macro F1, R², ROC AUC), which a "
                "stack's members cannot score apart")
    return None


class Scheduler(Relay):
    """Runs ``n_trials`` more trials of ``study`` (searching ``bound``'s space on its
    data set) on ``workers`` processes, each holding at most ``trials_per_worker``
    trials that are not paused (default: the space's ``budget.trials_per_worker``),
    within ``memory`` bytes for everything the run's processes use.  With several
    ``devices`` each has ``workers`` and ``memory`` of its own (on the CPU simulated:
    the run's budget is their sum, and each device carries an equal share of the
    scheduler's and the data's bytes); a trial runs in one worker, so on one device.
    ``main`` is what this process is charged: by default its whole memory, measured at
    the start (``explore run``'s process is the run's); a caller inside a bigger process
    (a test, a notebook holding other data) may say what of it the run accounts for.
    ``switch_dir``: the folder under which trials switched out of the arenas wait
    (:mod:`explore.scheduler.switched`; default: the system's temporary folder).
    ``prestarted``: workers started ahead of the run (:mod:`explore.scheduler.prestart`),
    taken where they were started as the run needs them; the rest are told to exit."""

    def __init__(self, bound: BoundSpace, study: optuna.Study,
                 data: LoadedData | SharedArrays, *,
                 workers: int, memory: int, device: str, devices: list[int] | None = None,
                 progress: Progress | None = None,
                 trials_per_worker: int | None = None, main: int | None = None,
                 keeper: ModelKeeper | None = None, baseline: int = 0,
                 smallest: int | None = None,
                 switch_dir: str | os.PathLike[str] | None = None,
                 prestarted: Prestarted | None = None) -> None:
        space = bound.space
        self.bound, self.space, self.device = bound, space, device
        self.devices = list(devices) if devices else [0]
        self.per_device = memory  # each device's budget
        self.keeper = keeper  # keeps the best trials' weights, if any
        self.switch_dir = switch_dir
        self.switched: SwitchFolder | None = None  # made as the workers start
        self.prestarted = prestarted
        self.smallest = smallest  # admission.admit's, when the runner admitted the run
        scale = getattr(bound.data, "target_scale", None)
        self.target_std = float(scale[1]) if scale else 1.0  # a regression's metrics' unit
        self.stored = study  # shared with any other drivers of the study
        # The stored study kept live (each trial claimed, reported and ended in it) and
        # the working copy the sampler and pruner consult (explore.live).
        self.live = LiveStudy(study, space, total=space.budget.trials, device=device,
                              grace=space.budget.grace)
        self.study = self.live.work
        self.n_workers = workers  # asked for
        # numpy's kernels or numba's in the workers (explore.scheduler.kernels)
        self.jit = for_workers(space.budget.kernels, memory, workers, device=device)
        self.n_running = workers * len(self.devices)  # started: fewer when the budget
        # holds fewer
        self.main = main
        # What this process held before the run began (a notebook's own data), which is
        # not the run's: only what the process grows beyond it is charged.
        self.baseline = baseline
        # Trials a worker holds at once: by default one running and one ready (the
        # worker starts it only when the other ends), which keeps the sampler and the
        # pruner about as well informed as a sequential search; more packs memory.
        self.trials_per_worker = max(1, trials_per_worker if trials_per_worker is not None
                                     else space.budget.trials_per_worker)
        self.stats = RunStats(memory * len(self.devices), devices=self.devices,
                              device=device, storage=self.live.storage_time)
        self.stats.kernels = kernels_of(self.jit)
        self.progress = progress or (lambda s: None)
        # The run's data: loaded into shared memory by the caller (load_shared), or given
        # as arrays and copied there.  The scheduler owns it from here and frees it in stop().
        self.arrays = data if isinstance(data, SharedArrays) else share_dataset(bound, data)
        self.stats.data = self.arrays.nbytes if device == "cpu" else 0
        self.ctx = mp.get_context("spawn")
        self.notes: dict[int, dict[str, Any]] = {}
        # Reproducible runs: with a sampler seed and one worker, the sampler and the
        # pruner must see the same history at the same points whatever the timing.  So
        # the next trial is asked only once every trial in hand has been told or paused,
        # and the worker runs one round at a time of the trial chosen by the core (every
        # trial gated, one "continue" at a time): what it runs and the order its reports
        # arrive in no longer depend on when messages cross.  It costs a round trip a
        # round and the look-ahead, so unseeded and multi-worker runs keep both.
        # With ``in_flight``, the core chooses every round of every trial (rotation), which
        # orders a seeded run on one worker as lockstep does, with more trials in hand.
        self.rotation = space.budget.in_flight
        self.lockstep = space.sampler.seed is not None and \
            workers * len(self.devices) == 1 and self.rotation is None
        if self.lockstep:
            self.trials_per_worker = 1
        self.policy = OptunaPolicy(self.study, space)
        self.validate_every = space.training.validation_interval(
            space.budget.rounds, prunes=self.policy.reports and space.pruner.name != "none")
        self.refresh_statistics = space.training.statistics_batches()
        # in rotation every trial waits for its word after each report: its next turn
        self.gated = self.policy.gated or self.rotation is not None
        self.core = Core(self.policy, self.stats, lockstep=self.lockstep,
                         switching=space.budget.switching, rotation=self.rotation,
                         switch_limit=space.budget.switch_limit,
                         timeout=space.budget.timeout)
        self.timed_out = False  # the run ended at its timeout, short of its trials
        # Trials asked at once and stacked where they can be (explore.scheduler.stacking);
        # not in lockstep, whose point is one trial at a time.
        unstacked = unstacked_because(space, self.lockstep, self.rotation)
        if unstacked and space.budget.stack > 1:
            self.stats.notes.append(f"budget.stack: {space.budget.stack} is not used: "
                                    f"{unstacked}")
        self.intake = Intake(bound, self.live, self.stats, self.notes, self._fail_new,
                             1 if unstacked else space.budget.stack,
                             # a seeded run on one worker: each trial validates in the
                             # chunks it was compiled for, whatever room is left
                             fallbacks=space.sampler.seed is None or
                             workers * len(self.devices) > 1,
                             rows=(self.arrays.spec["y_train"].shape[0],
                                   self.arrays.spec["y_valid"].shape[0]))
        self.remaining = 0
        self.asks = 0  # asks of the intake so far (intake.draws)
        self.blind = blind_draws(space)  # the sampler's first draws that read no result
        self.memory = MemorySampler(self.stats, this_process=main is None,
                                    baseline=baseline, device=device)
        self.t0 = time.time()

    @property
    def stack(self) -> int:
        return self.intake.stack

    # -- the run ---------------------------------------------------------------------------
    def _asks(self) -> bool:
        """Whether to ask for another candidate: while what was asked last found room and
        each worker has at most ``trials_per_worker`` trials in hand, so that candidates
        wait only when memory is full and the sampler is not asked far ahead of the
        results it learns from; in rotation, while fewer than ``in_flight`` are in hand.
        Never once the budget's ``timeout`` has passed (:meth:`Core.takes_new`)."""
        if not self.core.takes_new():
            return False
        if self.rotation is not None:
            return self.core.in_rotation() < self.rotation
        return not self.waiting and \
            self.core.in_hand() < self.trials_per_worker * len(self.workers)

    def _draw(self) -> bool:
        """Ask the intake for candidates: one ask, whose candidates wait to be placed,
        or, while the sampler draws blind, enough asks for
        :func:`~explore.scheduler.core.placing.ahead` trials, held ahead until the loop
        releases them (:meth:`Core.release`).  False once the study's total is claimed
        and nothing was drawn."""
        want = self.core.draw_size(self.blind, sum(self.live.counts()), len(self.workers),
                                   self.live.unclaimed())
        drawn = 0
        for i in range(want):  # an ask that finds the total unclaimed draws one at least
            if i and (self.stop_flag.set or (self.blind is not None and
                      sum(self.live.counts()) >= self.blind)):
                break  # stopped (Ctrl-C), or other drivers took the blind draws meanwhile
            asked = time.perf_counter()
            more, pendings = self.intake.ask(most=draws(
                self.stack, self.live.unclaimed(), len(self.workers), self.asks))
            self.asks += 1
            self.stats.asking_s += time.perf_counter() - asked
            for pend in pendings:  # one at a time, the cheapest first, where drawn ahead
                self._tell_core(Admitted(pend, ahead=want > 1))
            drawn += sum(len(p.trials) for p in pendings)
            if not more:
                return i > 0
            if drawn >= want:
                break
        return True

    def run(self, n_trials: int) -> RunStats:
        """Run until the study has ``n_trials`` trials that ended (its total, shared with
        any other drivers of the study: :mod:`explore.live`), or, with the budget's
        ``timeout``, until the trials in hand when it passed have ended
        (:attr:`timed_out`; the next run goes on with the study).  Ctrl-C fails the
        trials in hand as interrupted, queues them again and raises KeyboardInterrupt; a
        failed write to the storage stops the run at once
        (:class:`~explore.live.WriteFailed`)."""
        self.live.total = n_trials
        restore = self._catch_ctrl_c()
        ended = False
        try:
            self.start()
            next_claim = 0.0  # when to try again after the study had its total claimed
            while True:
                if self.stop_flag.set:
                    raise Stopped(self.stop_flag.signum)
                self.live.check()  # a failed write stops the run here
                self._tell_core(Tick(time.time() - self.t0))
                while not self.stop_flag.set and self._asks() and \
                        (self.core.ahead or time.time() >= next_claim):
                    if not self.core.ahead and not self._draw():
                        next_claim = time.time() + REFRESH_EVERY / 4
                        break
                    self.core.release()  # the cheapest drawn ahead, if any, is placed
                    self.remaining = self.live.unclaimed()
                    self._do(self.core.place())
                    # asking takes time (compiling): the timeout is read at the time now
                    self._tell_core(Tick(time.time() - self.t0))
                self.live.refresh()
                self.remaining = self.live.unclaimed()
                if not self.core.holds():
                    settled = self.live.settled()
                    if settled or not self.core.takes_new():
                        if not settled:  # short of the study's total: said in the summary
                            self.timed_out = True
                            self.stats.notes.append(self._timeout_note())
                        self.memory.measure(self.workers.values(), now=True)  # a last reading
                        ended = True
                        break
                    time.sleep(REFRESH_EVERY / 8)  # others' trials run; ours may be re-queued
                    continue
                if self.core.idle():
                    acted = self.core.handle(Idle())
                    self._do(acted)
                    self._do(self.core.place())
                    if acted:
                        continue
                    # nothing to do but wait: a message will come (a death, say)
                self._do(self.core.go())
                self._events()
                self._do(self.core.place())
        except KeyboardInterrupt:
            self._interrupted()
            raise
        finally:
            # The handlers stay until the cleanup is done: a second signal meanwhile
            # ends the process through them (which removes the shared data set), where
            # Python's own handler would raise in the middle of the cleanup and skip
            # the rest of it.
            try:
                self.stats.wall_s = time.time() - self.t0
                self.stop()
                if ended:  # not on Ctrl-C: measuring the peak the first time takes a second
                    self.stats.peak_flops = machine_peak(self.stats.device)
                try:
                    self.live.close()
                    if self.live.writer.taken_over:
                        self.stats.notes.append(
                            f"{self.live.writer.taken_over} writes to trials of this driver "
                            "were dropped: it was silent past the grace (stalled or "
                            "suspended), and another driver failed those trials as stale "
                            "and queued them again")
                finally:
                    if self.keeper is not None:
                        self.keeper.close()
            finally:
                restore()
        return self.stats

    def close(self) -> None:
        """End a scheduler that is not run: :meth:`stop`, then the study's writer (whose
        thread otherwise beats this driver's heartbeat into the storage for as long as the
        process lives) and the keeper.  :meth:`run` does all of it itself; raises
        :class:`~explore.live.WriteFailed` if a write failed."""
        try:
            self.stop()
        finally:
            try:
                self.live.close()
            finally:
                if self.keeper is not None:
                    self.keeper.close()

    def _timeout_note(self) -> str:
        """What the summary says of a run that ended at its timeout."""
        return (f"stopped at the timeout ({self.core.timeout:g} s, budget.timeout): no "
                "trial started after it, and the trials in hand ran to their end, short of "
                f"the study's {self.live.total} trials; running it again goes on")

    def _catch_ctrl_c(self) -> Any:
        """Ctrl-C, SIGTERM or SIGHUP stops the run between steps; a second one ends the
        process at once, the shared data set removed first."""
        self.stop_flag = StopFlag()
        return catch_stop_signals(self.stop_flag, lambda: os.unlink(self.arrays.path))

    def _interrupted(self) -> None:
        """Ctrl-C (or SIGTERM, SIGHUP): every trial in hand fails as interrupted and is
        queued again in the storage for the next run (a second signal meanwhile ends
        the process at once)."""
        self.stop_flag.set = True  # a second signal meanwhile ends the process
        held = sum(len(w.residents) for w in self.workers.values()) + len(self.core.out) + \
            sum(len(p.trials) for p in self.core.waiting + self.core.ahead)
        self._tell_core(Interrupted())
        by = Stopped(self.stop_flag.signum).name
        self.stats.notes.append(f"interrupted ({by}): {held} trials in hand failed and "
                                "queued again for the next run")


def machine_peak(device: str) -> float | None:
    """The machine's GEMM peak in FLOP/s as measured before, outside any run
    (:func:`explore.scheduler.peak.gemm_peak`, or ``$EXPLORE_GEMM_PEAK``), or None: the
    run's figures then go without it.  A run never times products itself: their
    operands would spend its budget (workers may still be exiting when it ends)."""
    try:
        return gemm_peak(device, None, measure=False)
    except Exception:  # a utilisation figure never fails a run
        return None
