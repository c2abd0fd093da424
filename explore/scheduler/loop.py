"""The run: ask Optuna for trials, size and place them, and tell it what the workers
report, until the study has ``n_trials`` trials that ended (its total, shared with any
other drivers of the study).

Everything here runs on the scheduler's one thread; the workers' messages
(:mod:`explore.protocol`) are read as they come.  A report is passed to the trial's
pruner at once: "prune" stops the trial, a rung pruner's "prune" may pause it at the
rung instead (:mod:`explore.rungs`), and every report may promote a paused trial.
Each trial is claimed in the stored study when it is asked for, its reports and its end
written there by a writer thread (:class:`explore.live.LiveStudy`).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Any

import optuna
from optuna.trial import TrialState

from engine import BudgetError
from engine.alignment import align_down, align_up
from engine.compile.stack import StackError
from engine.errors import EngineError
from explore import metrics, sampling
from explore.builders import BuildError
from explore.candidate import compile_candidate, graph_of
from explore.datasets import Dataset
from explore.keeper import ModelKeeper
from explore.live import REFRESH_EVERY, LiveStudy
from explore.optuna_adapter import frozen_trial as frozen
from explore.procmem import children, pss
from explore.protocol import (
    Continue,
    Done,
    FromWorker,
    Part,
    Pause,
    Regroup,
    Regrouped,
    Report,
    Start,
    Stop,
    ToWorker,
    TrialFailed,
)
from explore.rungs import failed_rung, pauses, promotable, rungs_done
from explore.sampling import suggest
from explore.scheduler.constants import Measured, machine_key, workers_that_fit
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import save as save_constants
from explore.scheduler.errors import STOP_SIGNALS, SchedulerError, Stopped
from explore.scheduler.placement import Placement, Stack, Worker, find_spot
from explore.scheduler.processes import await_ready, open_arena, spawn, stop_all
from explore.scheduler.shared_data import share_dataset
from explore.scheduler.stacking import (
    Drawn,
    Pending,
    compile_stack,
    groups,
    part_program,
    stacks_for,
)
from explore.scheduler.telemetry import MemorySampler, Progress, RunStats, Sample
from explore.shared import SharedArrays
from explore.space import Space
from explore.study import PARAMS_ATTR, RECORD_ATTR
from explore.worker import release_heap_memory

# A process's PSS gives it a share of each page it maps with others, and other programs
# (any Python with numpy) map the same libraries: as they start and end, the run's PSS
# moves by a few MB though it allocates nothing.  This much of the budget (at least
# HEADROOM_MIN bytes) is held back for that; growth the run measures uses it first.
HEADROOM = 0.02
HEADROOM_MIN = 2_000_000


# A CUDA device maps memory in pages of 2 MiB and rounds each allocation up to them
# (measured on an H100: a heap's device memory is its planned bytes rounded up to 2 MiB).
# An arena on a GPU is a whole number of pages, so that what it takes is what it holds.
GPU_PAGE = 2 << 20


def arena_size(left: int, device: str) -> int:
    """An arena of at most ``left`` bytes: 64-byte aligned, whole 2 MiB pages on a GPU.

    >>> arena_size(5_000_050, "cpu"), arena_size(5_000_050, "gpu")
    (5000000, 4194304)
    """
    return align_down(left, GPU_PAGE) if device == "gpu" else align_down(left)


def admitted_heap(smallest: int, device: str) -> int:
    """What admitting a candidate of ``smallest`` heap bytes holds back per worker: on
    a GPU whole pages, as its arena will be (:func:`arena_size`), so that a budget that
    admits a worker also gives it an arena the candidate fits in.

    >>> admitted_heap(525_696, "cpu"), admitted_heap(525_696, "gpu")
    (525696, 2097152)
    """
    return align_up(smallest, GPU_PAGE) if device == "gpu" else smallest


def headroom(budget: int) -> int:
    """What of ``budget`` is held back for shared pages' PSS to move in."""
    return max(HEADROOM_MIN, int(budget * HEADROOM))


class Scheduler:
    """Runs ``n_trials`` more trials of ``study`` on ``workers`` processes, each
    holding at most ``trials_per_worker`` trials that are not paused (default: the
    space's ``budget.trials_per_worker``), within ``memory`` bytes for everything the
    run's processes use.  With several ``devices`` each has ``workers`` and ``memory``
    of its own (on the CPU simulated: the run's budget is their sum, and each device
    carries an equal share of the scheduler's and the data's bytes); a trial runs in
    one worker, so on one device.  ``main`` is what this process is charged: by default its
    whole memory, measured at the start (``explore run``'s process is the run's); a
    caller inside a bigger process (a test, a notebook holding other data) may say what
    of it the run accounts for."""

    def __init__(self, space: Space, study: optuna.Study, data: Dataset | SharedArrays, *,
                 workers: int, memory: int, device: str, devices: list[int] | None = None,
                 progress: Progress | None = None,
                 trials_per_worker: int | None = None, main: int | None = None,
                 keeper: ModelKeeper | None = None, baseline: int = 0) -> None:
        self.space, self.device = space, device
        self.devices = list(devices) if devices else [0]
        self.per_device = memory  # each device's budget
        self.keeper = keeper  # keeps the best trials' weights, if any
        scale = getattr(space.data, "target_scale", None)
        self.target_std = float(scale[1]) if scale else 1.0  # a regression's metrics' unit
        self.stored = study  # shared with any other drivers of the study
        # The stored study kept live (each trial claimed, reported and ended in it) and
        # the working copy the sampler and pruner consult (explore.live).
        self.live = LiveStudy(study, space, total=space.budget.trials, device=device,
                              grace=space.budget.grace)
        self.study = self.live.work
        self.n_workers = workers  # asked for
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
        self.progress = progress or (lambda s: None)
        # The run's data: loaded into shared memory by the caller (load_shared), or given
        # as arrays and copied there.  The scheduler owns it from here and frees it in stop().
        self.arrays = data if isinstance(data, SharedArrays) else share_dataset(space, data)
        self.stats.data = self.arrays.nbytes if device == "cpu" else 0
        self.ctx = mp.get_context("spawn")
        self.workers: dict[int, Worker] = {}
        self.waiting: list[Pending] = []
        self.notes: dict[int, dict[str, Any]] = {}
        # A rung pruner's trials wait for its word after each report, so that one it
        # would stop can be paused at the rung instead (explore.rungs).
        self.gated = space.pruner.pause and len(self.study.directions) == 1 and \
            pauses(self.study.pruner)
        # Reproducible runs: with a sampler seed and one worker, the sampler and the
        # pruner must see the same history at the same points whatever the timing.  So
        # the next trial is asked only once every trial in hand has been told or paused,
        # and the worker runs one round at a time of the trial chosen here (every trial
        # gated, one "continue" at a time): what it runs and the order its reports
        # arrive in no longer depend on when messages cross.  It costs a round trip a
        # round and the look-ahead, so unseeded and multi-worker runs keep both.
        self.lockstep = space.sampler.seed is not None and workers * len(self.devices) == 1
        if self.lockstep:
            self.trials_per_worker = 1
        self.ready: list[tuple[Worker, Placement]] = []  # lockstep: to continue, in turn
        # Trials asked at once and stacked where they can be (explore.scheduler.stacking);
        # not in lockstep, whose point is one trial at a time.
        self.stack = space.budget.stack if not self.lockstep and stacks_for(space) else 1
        self.stack_numbers = -1  # a stack's own number: negative, never a trial's
        self._regroups_waiting = False  # some stack's regroup_due is set
        # Stacks running with members masked for want of room to regroup: due again
        # when memory is given back.
        self._masked: list[tuple[Worker, Stack]] = []
        self.in_flight: int | None = None  # lockstep: the trial the worker is running
        self.remaining = 0
        self.memory = MemorySampler(self.stats, this_process=main is None,
                                    baseline=baseline, device=device)
        self.t0 = time.time()

    # -- workers -------------------------------------------------------------------------
    def _spawn(self, index: int) -> Worker:
        # Each worker's share of the cores: of the workers that run (fewer than asked
        # when the budget holds fewer), once that is known.  Workers take the devices
        # in turn, so each has as many as the others (a replacement keeps its index).
        return spawn(self.ctx, index, self.arrays.spec, self.device, self.n_running,
                     self.devices[index % len(self.devices)])

    def start(self) -> None:
        """Measure what the run costs before any trial, start as many workers as the
        budget holds (at most ``workers``), and give each an equal arena of the rest.

        The scheduler's own process is measured now (the data it has loaded excluded:
        that is counted once, as ``data``); a worker's cost and the resource tracker's
        come from an earlier run on this machine (:mod:`.constants`) or, on the first,
        from starting one worker and measuring.  A budget that cannot hold the scheduler,
        one worker and the space's smallest candidate is refused with the minimum that
        would do; one that holds fewer workers than asked runs with fewer, and says so."""
        s = self.stats
        smallest = self._smallest_heap()  # first: compiling is part of this process's cost
        if self.main is not None:
            s.main = self.main
        elif self.device == "cpu":  # on a GPU the host processes hold none of the budget
            gc.collect()
            release_heap_memory()  # what loading the data freed goes back to the system
            s.main = max(0, pss() - s.data - self.baseline)  # it wrote every data page
        key = machine_key(self.device)
        known = load_constants(key)
        if known is None:  # the first run here: start one worker to measure one (even
            # for a budget about to be refused: the minimum it names must be right)
            self._start_workers(1)
            known = self._measured(key)
        per, ndev = self.per_device, len(self.devices)
        s.headroom = headroom(per) * ndev
        n = min(self.n_workers, workers_that_fit(per - headroom(per),
                                                 self._host_share(known.tracker),
                                                 known.worker,
                                                 admitted_heap(smallest, self.device)))
        if n < 1:
            raise SchedulerError(self._too_small(smallest, known))
        self.n_running = n * ndev
        self._start_workers(n * ndev - len(self.workers))
        known = self._measured(key)
        ws = list(self.workers.values())
        if n < self.n_workers:
            where = f"each device's budget of {per:,} bytes" if ndev > 1 else \
                f"the budget of {per:,} bytes"
            costs = (f"{known.worker:,} bytes of device memory before any trial (its CUDA "
                     f"context and libraries)" if self.device == "gpu" else
                     f"{known.worker:,} bytes before any trial, beside "
                     f"{s.main + s.tracker:,} for the scheduler and {s.data:,} for the data")
            s.notes.append(f"{where} holds {n} of the {self.n_workers} "
                           f"workers asked for: each costs {costs}")
        s.overheads = [w.overhead for w in ws]
        arenas = {d: self._arena_on(d, [w for w in ws if w.device == d])
                  for d in self.devices}
        if min(arenas.values()) < smallest:
            raise SchedulerError(self._too_small(smallest, known))
        for w in ws:
            open_arena(w, arenas[w.device])
        s.arena = min(arenas.values())  # what a candidate is compiled to fit
        self._sample()

    def _host_share(self, tracker: int) -> int:
        """What each device carries of the processes' bytes that are no worker's (the
        scheduler, the resource tracker, the data): all of it with one device, an
        equal share with several simulated on the CPU (on a GPU the host's memory is
        not the budget's: none is measured there)."""
        s = self.stats
        return -(-(s.main + tracker + s.data) // len(self.devices))

    def _arena_on(self, device: int, ws: list[Worker]) -> int:
        """Each arena of ``ws``, the workers on ``device``: an equal part of what the
        device's budget leaves beside their overheads, its share of the host's bytes
        and its headroom."""
        per = self.per_device
        left = per - headroom(per) - self._host_share(self.stats.tracker) - \
            sum(w.overhead for w in ws)
        return arena_size(left // len(ws), self.device)

    def _start_workers(self, count: int) -> None:
        """Start ``count`` more workers (in parallel) and wait until each is ready."""
        ws = [self._spawn(len(self.workers) + i) for i in range(count)]
        for w in ws:
            self.workers[w.index] = w  # known to stop() from now on
        for w in ws:
            await_ready(w)

    def _measured(self, key: str) -> Measured:
        """The constants as this run's processes measure now; remembered for the next."""
        tracker = self._tracker_bytes() if self.device == "cpu" else 0
        m = Measured(max(w.overhead for w in self.workers.values()), tracker)
        save_constants(key, m)
        self.stats.tracker = m.tracker
        return m

    def _tracker_bytes(self) -> int:
        """multiprocessing's resource tracker (a child of this process, started with the
        first worker): every descendant that is not a worker."""
        workers = {w.pid for w in self.workers.values()}
        return sum(pss(c) for c in children() if c not in workers)

    def _smallest_heap(self) -> int:
        """The heap of the space's smallest candidate (every range at its low end) at
        its training batch (batch 1 for ``auto``), as an arena holds it."""
        params = sampling.fixed(self.space)
        if params["batch_size"] == "auto":
            params["batch_size"] = 1
        # a builder's model is the user's code: what it raises is its trial's failure
        failing: tuple[type[Exception], ...] = (BudgetError, *self._user_errors())
        try:
            cand = compile_candidate(self.space, params, 1 << 62)
        except failing:
            return 0  # it fails on its own, when asked for, with its reason
        return align_up(min(p.total_bytes for p in cand.fitting()))

    def _too_small(self, smallest: int, known: Measured) -> str:
        s = self.stats
        heap = admitted_heap(smallest, self.device)
        need = self._host_share(known.tracker) + heap + known.worker
        # With the headroom, and what the processes measure varies by a fraction of a
        # percent from run to run.
        least = -(-max(need + HEADROOM_MIN, int(need / (1 - HEADROOM))) * 101 // 100
                  // 1_000_000)
        ndev = len(self.devices)
        each = f" on each of {ndev} devices" if ndev > 1 else ""
        share = f" (each device's share of them: {self._host_share(known.tracker):,})" \
            if ndev > 1 and self.device == "cpu" else ""
        if self.device == "gpu":  # the host's processes hold no device memory
            takes = (f"{known.worker:,} bytes of device memory for a worker (its CUDA "
                     f"context and libraries) and {heap:,} for the smallest candidate of "
                     f"the space ({smallest:,} bytes, in whole 2 MiB pages)")
        else:
            takes = (f"{s.main:,} bytes for the scheduler, {s.data:,} for the data, "
                     f"{known.tracker:,} for multiprocessing's resource tracker{share}, "
                     f"{known.worker:,} for a worker and {smallest:,} for the smallest "
                     f"candidate of the space")
        return (f"a budget of {self.per_device:,} bytes{each} cannot hold this run: it "
                f"takes {takes}, {need:,} in all{each}; --memory {least}MB is the least "
                f"that would do")

    def stop(self) -> None:
        stop_all(self.workers.values())
        self.arrays.close()

    # -- accounting ----------------------------------------------------------------------
    def _sample(self) -> None:
        heaps = sum(w.heap_bytes() for w in self.workers.values())
        self.stats.record(Sample(time.time() - self.t0, heaps, self.stats.fixed,
                                 len(self.waiting), self.remaining))
        self.memory.measure(self.workers.values())
        self.stats.counts["running"] = self._in_hand()
        self.stats.counts["waiting"] = len(self.waiting)
        self.progress(self.stats)

    # -- the run ---------------------------------------------------------------------------
    def run(self, n_trials: int) -> RunStats:
        """Run until the study has ``n_trials`` trials that ended (its total, shared with
        any other drivers of the study: :mod:`explore.live`).  Ctrl-C fails the trials
        in hand as interrupted, queues them again and raises KeyboardInterrupt; a failed
        write to the storage stops the run at once (:class:`~explore.live.WriteFailed`)."""
        self.live.total = n_trials
        restore = self._catch_ctrl_c()
        try:
            self.start()
            next_claim = 0.0  # when to try again after the study had its total claimed
            while True:
                if self.ctrl_c:
                    raise Stopped(self.stop_signal)
                self.live.check()  # a failed write stops the run here
                # Ask while what was asked last found room and each worker has at most
                # `trials_per_worker` trials in hand: candidates wait only when memory is full, and
                # the sampler is not asked far ahead of the results it learns from.
                while time.time() >= next_claim and not self.waiting and self._in_hand() < \
                        self.trials_per_worker * len(self.workers):
                    if not self._ask():
                        next_claim = time.time() + REFRESH_EVERY / 4
                        break
                    self.remaining = self.live.unclaimed()
                    self._place()
                self.live.refresh()
                self.remaining = self.live.unclaimed()
                if not self.waiting and not any(w.residents for w in self.workers.values()):
                    if self.live.settled():
                        self.memory.measure(self.workers.values(), now=True)  # a last reading
                        break
                    time.sleep(REFRESH_EVERY / 8)  # others' trials run; ours may be re-queued
                    continue
                if not any(w.active() for w in self.workers.values()):
                    # Only paused trials are held, and nothing runs that could promote
                    # them: a waiting trial needs the memory of the one paused longest
                    # (passed over by every result since), or the run is over for all.
                    paused = self._paused()
                    for w, p in paused[:1] if self.waiting else paused:
                        self._prune(w, p)
                    self._place()
                    continue
                self._go()
                self._events()
                self._place()
        except KeyboardInterrupt:
            self._interrupted()
            raise
        finally:
            # The handlers stay until the cleanup is done: a second signal meanwhile
            # ends the process through them (which removes the shared data set), where
            # Python's own handler would raise in the middle of the cleanup and skip
            # the rest of it.
            try:
                self.stop()
                try:
                    self.live.close()
                finally:
                    if self.keeper is not None:
                        self.keeper.close()
            finally:
                restore()
        return self.stats

    def _catch_ctrl_c(self) -> Any:
        """Ctrl-C, SIGTERM or SIGHUP sets a flag that the loop acts on between steps
        (raised anywhere, it broke storage writes half way); a second one ends the
        process at once.  Returns what puts the previous handlers back."""
        import os
        import signal
        import threading

        self.ctrl_c = False
        self.stop_signal = int(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: Any) -> None:
            if self.ctrl_c:  # no time to clean up: but the shared data set, at least
                with contextlib.suppress(OSError, AttributeError):
                    os.unlink(self.arrays.path)
                os._exit(128 + signum)
            self.ctrl_c, self.stop_signal = True, signum

        previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _interrupted(self) -> None:
        """Ctrl-C (or SIGTERM, SIGHUP): every trial in hand fails as interrupted and is
        queued again in the storage for the next run (a second signal meanwhile ends
        the process at once)."""
        self.ctrl_c = True
        held = [p.trial for w in self.workers.values() for p in w.residents.values()]
        for trial in held + [t for pend in self.waiting for t in pend.trials]:
            self._fail(trial, "interrupted", retry=True)
        self.waiting = []
        by = Stopped(self.stop_signal).name
        self.stats.notes.append(f"interrupted ({by}): {len(held)} trials in hand failed and "
                                "queued again for the next run")

    def _note(self, trial: optuna.trial.Trial, write: bool = False, ending: bool = False,
              **values: Any) -> None:
        """Collect what a trial records; write it as one user attribute (``explore``) when
        asked: one storage transaction rather than one per value.  ``ending``: the trial
        is about to end, and its end writes the record with its state."""
        record = self.notes.setdefault(trial.number, {})
        record.update(values)
        if write or ending:
            trial.set_user_attr(RECORD_ATTR, record)
        if write and not ending:
            self.live.record(trial, record)

    def _tell(self, trial: optuna.trial.Trial, values: Any = None,
              state: TrialState | None = None, saved: str | None = None,
              retry: bool = False) -> None:
        self.live.finish(trial, values, state=state, retry=retry,
                         keep=None if self.keeper is None or saved is None
                         else self.keeper.keeping(saved))

    def _in_hand(self) -> int:
        """Trials held and not paused: what the sampler's look-ahead is counted in."""
        return sum(w.active() for w in self.workers.values())

    def _paused(self) -> list[tuple[Worker, Placement]]:
        return sorted(((w, p) for w in self.workers.values() for p in w.residents.values()
                       if p.paused is not None), key=lambda wp: wp[1].trial.number)

    def _ask(self) -> bool:
        """Claim trials of the study (queued ones first), sample and size them and put
        them among the waiting: one, or up to ``budget.stack`` at once, stacked where
        they share an architecture and an optimizer kind.  False when the study's total
        is claimed."""
        drawn: list[Drawn] = []
        claimed_all = False
        for _ in range(self.stack):
            d = self._draw()
            if d is None:
                claimed_all = True
                break
            if isinstance(d, Drawn):
                drawn.append(d)
        if not drawn:
            return not claimed_all
        for group in groups(drawn) if self.stack > 1 else [[x] for x in drawn]:
            if len(group) > 1 and self._ask_stack(group):
                continue
            for x in group:
                self._compile_alone(x)
        return True

    def _draw(self) -> Drawn | bool | None:
        """Claim a trial, sample it and build its graph: None when the study's total is
        claimed, False when the trial failed already (its builder raised)."""
        claim = self.live.claim()
        if claim is None:
            return None
        drawn: dict[str, Any] = {}

        def draw(t: optuna.trial.Trial) -> dict[str, Any]:
            # the last draw is the one kept: a draw given up (a point taken, a duplicate)
            # is drawn again, and the trial trains what the stored trial holds
            drawn["p"] = suggest(t, self.space)
            return drawn["p"]

        trial = self.live.ask(claim, draw)
        if trial is None:
            return None
        params = drawn["p"]
        requeued = self.live.requeued(trial)
        self.notes.setdefault(trial.number, {})[PARAMS_ATTR] = params
        try:
            graph = graph_of(self.space, params, trial=trial if self.space.uses_builder
                             else None)
            if self.space.uses_builder:
                self.live.new_params(trial)  # the builder's own, seen by other drivers
        except self._user_errors() as e:
            self._fail_build(trial, e)
            return False
        return Drawn(trial, params, graph, requeued)

    def _user_errors(self) -> tuple[type[Exception], ...]:
        """What building a model raises for its own trial to fail: the user's model code
        fails its own trial, whatever it raised; the run goes on."""
        return (BuildError, EngineError) if self.space.uses_builder else (BuildError,)

    def _fail_build(self, trial: optuna.trial.Trial, e: Exception) -> None:
        self._fail(trial, str(e) if isinstance(e, BuildError) else
                   f"{type(e).__name__}: {e}", never_started=True)

    def _compile_alone(self, d: Drawn) -> None:
        try:
            cand = compile_candidate(self.space, d.params, self.stats.arena, graph=d.graph)
        except BudgetError as e:
            self._fail(d.trial, f"does not fit: {e}", never_started=True)
            return
        except self._user_errors() as e:
            self._fail_build(d.trial, e)
            return
        self.waiting.append(Pending([d.trial], cand, [d.requeued]))

    def _ask_stack(self, group: list[Drawn]) -> bool:
        """Put ``group`` among the waiting as one stack; False if it does not stack or
        does not fit an arena (its trials then run one by one)."""
        try:
            self.waiting.append(compile_stack(self.space, group, self.stats.arena))
        except StackError as e:  # an op of the model has no stacked form: none will
            self.stack = 1
            self.stats.notes.append(f"trials are not stacked: {e}")
            return False
        except (BudgetError, BuildError, EngineError):
            return False  # too big as a stack, say: its trials run alone
        self.stats.counts["stacked"] = self.stats.counts.get("stacked", 0) + len(group)
        return True

    def _place(self) -> None:
        self._regroup_due()  # members of stacks first: they hold their memory already
        still = []
        batch, self.waiting = self.waiting, []  # a worker dying below may re-queue into it
        s = self.stats
        heaps = sum(w.heap_bytes() for w in self.workers.values())
        for pend in batch:
            cand = pend.candidate
            spot = find_spot(self.workers, cand)
            # Processes that grew beyond their measured constants take room from the
            # heaps: a trial waits until the ones placed leave enough of the budget, and
            # one that could not fit even with none placed fails with the reason.
            if spot is not None and \
                    heaps + spot.size + s.fixed + max(s.growth, s.headroom) > s.budget:
                if heaps == 0:
                    for trial in pend.trials:
                        self._fail(trial, f"does not fit: the run's processes grew by "
                                   f"{s.growth:,} bytes beyond their measured constants, "
                                   f"and the budget left holds less than its {spot.size:,}",
                                   never_started=True)
                    continue
                spot = None
            if spot is None:
                still.append(pend)
                continue
            heaps += spot.size
            w, prog = spot.worker, spot.program
            w.free.take(spot.offset, spot.size)
            now = time.time()
            stack = None
            if pend.stacked:
                numbers = tuple(t.number for t in pend.trials)
                stack = Stack(self._stack_number(), spot.offset, spot.size, prog, numbers,
                              dict(zip(numbers, pend.graphs, strict=True)),
                              dict(zip(numbers, pend.optimizers, strict=True)),
                              held=set(numbers))
                w.stacks[stack.number] = stack
            for k, (trial, requeued) in enumerate(zip(pend.trials, pend.requeued,
                                                      strict=True)):
                w.residents[trial.number] = Placement(
                    trial, cand, w.index, spot.offset, 0 if stack else spot.size, now,
                    requeued, stack=stack)
                extra: dict[str, Any] = {} if stack is None else \
                    {"stack": {"models": len(pend.trials), "model": k,
                               "trials": list(stack.members)}}
                self._note(trial, planned_bytes=prog.zone_bytes, total_bytes=prog.total_bytes,
                           batch_size=cand.train_batch, compiled_batch=prog.batch_size,
                           worker=w.index, device_index=w.device, arena_offset=spot.offset,
                           placed_at=now - self.t0, write=True, **extra)
            first = pend.trials[0]
            seed = self.space.budget.seed + self.live.stored_number(first)
            saves = [self.keeper.stage(t.number) if self.keeper else None
                     for t in pend.trials]
            msg = Start(first.number if stack is None else stack.number, prog, spot.offset,
                        seed, self.space.budget.rounds, cand.train_batch,
                        self.gated or self.lockstep, self.target_std,
                        saves[0] if stack is None else None,
                        members=() if stack is None else stack.members,
                        member_save_to=() if stack is None else tuple(saves))
            if not self._send(w, msg):
                still.append(pend)  # its placement went with the worker
            elif self.lockstep:
                self.in_flight = first.number
        self.waiting = still + self.waiting
        self._sample()

    def _stack_number(self) -> int:
        self.stack_numbers -= 1
        return self.stack_numbers + 1

    # -- stacks: members leave, pause and come back ------------------------------------------
    def _regroup(self, w: Worker, st: Stack) -> bool:
        """Move what ``st`` still holds into new programs beside it when some member left
        or is paused: the members going on into one (a smaller stack, or one alone),
        each paused member into one of its own.  True once sent; False when the parts
        do not fit the worker's arena now (``regroup_due``: tried again as memory is
        given back), or when nothing needs moving."""
        if st.regrouping or w.stacks.get(st.number) is not st:
            return False
        placed = {m: w.residents[m] for m in st.members if m in st.held}
        going = [m for m in st.members if m in placed and placed[m].paused is None]
        paused = [m for m in st.members if m in placed and placed[m].paused is not None]
        if not placed or (not paused and len(going) == len(st.members)) or not going:
            st.regroup_due = False  # all go on, or all wait: the stack stays as it is
            return False
        groups_ = [going] + [[m] for m in paused]
        programs = [part_program(st, g) for g in groups_]
        s = self.stats
        heaps = sum(x.heap_bytes() for x in self.workers.values())
        taken: list[tuple[int, int]] = []
        for prog in programs:
            size = align_up(prog.total_bytes)
            fit = w.free.best_fit(size)
            if fit is None or heaps + size + s.fixed + max(s.growth, s.headroom) > s.budget:
                for off, n in taken:
                    w.free.release(off, n)
                return False
            w.free.take(fit[0], size)
            taken.append((fit[0], size))
            heaps += size
        parts = []
        for g, prog, (offset, size) in zip(groups_, programs, taken, strict=True):
            for m in g:  # in the trial's record (written when it ends)
                self.notes.setdefault(m, {}).setdefault("moves", []).append(
                    {"models": len(g), "paused": placed[m].paused is not None,
                     "at": round(time.time() - self.t0, 3)})
            if len(g) == 1:
                p = placed[g[0]]
                p.stack, p.offset, p.size = None, offset, size
                parts.append(Part(g[0], prog, offset, tuple(g), p.paused is not None))
                continue
            sub = Stack(self._stack_number(), offset, size, prog, tuple(g),
                        {m: st.graphs[m] for m in g}, {m: st.optimizers[m] for m in g},
                        held=set(g))
            w.stacks[sub.number] = sub
            for m in g:
                placed[m].stack, placed[m].offset = sub, offset
            parts.append(Part(sub.number, prog, offset, tuple(g)))
        st.regrouping, st.regroup_due, st.held = True, False, set()
        self.stats.counts["regrouped"] = self.stats.counts.get("regrouped", 0) + 1
        return self._send(w, Regroup(st.number, tuple(parts)))

    def _regroup_due(self) -> None:
        """Regroup the stacks whose members left or paused, once the reports of a round
        are read (they come together).  A paused member whose heap of its own does not
        fit is pruned instead, as a rung pruner that does not pause would have (holding
        it apart needs memory); a stack that only lost members and finds no room now
        goes on with them masked, and is tried again when memory is given back."""
        if not self._regroups_waiting:
            return
        self._regroups_waiting = False
        for w in list(self.workers.values()):
            for st in list(w.stacks.values()):
                if not st.regroup_due or self.workers.get(w.index) is not w:
                    continue
                if self._regroup(w, st):
                    continue
                stuck = [w.residents[m] for m in st.members if m in st.held and
                         w.residents[m].paused is not None]
                if stuck and len(stuck) < len(st.held):
                    for p in stuck:  # they cannot wait apart: pruned, and the rest go on
                        self._prune(w, p, regroup=False)
                    if not self._regroup(w, st) and st.regroup_due:
                        st.regroup_due = False  # masked until memory is given back
                        self._masked.append((w, st))
                elif st.regroup_due:
                    st.regroup_due = False
                    self._masked.append((w, st))

    def _send(self, w: Worker, msg: ToWorker) -> bool:
        """Send, or handle the worker's death (its residents fail and are re-queued)."""
        try:
            w.conn.send(msg)
            return True
        except (BrokenPipeError, EOFError, OSError):
            w.process.join(timeout=5)
            if isinstance(msg, Start):  # not placed: it waits again (see _place)
                for n in msg.members or (msg.number,):
                    w.residents.pop(n)
                w.stacks.pop(msg.number, None)
                w.free.release(msg.offset, align_up(msg.program.total_bytes))
            self._crashed(w)
            return False

    def _events(self) -> None:
        conns = {w.conn: w for w in self.workers.values()}
        sentinels = {w.process.sentinel: w for w in self.workers.values()}
        for ready in wait([*conns, *sentinels], timeout=1.0):  # Ctrl-C is seen within 1 s
            w = conns.get(ready) or sentinels.get(ready)  # type: ignore[call-overload]
            if w is None or w.index not in self.workers:
                continue
            try:
                while w.conn.poll(0):
                    self._handle(w, w.conn.recv())
            except (EOFError, OSError):
                pass
            if not w.process.is_alive():
                self._crashed(w)

    def _handle(self, w: Worker, msg: FromWorker) -> None:
        if isinstance(msg, Regrouped):  # the old stack's region is free in the worker now
            st = w.stacks.pop(msg.number, None)
            if st is not None:
                w.free.release(st.offset, st.size)
                self._memory_freed()
            return
        if not isinstance(msg, Report | Done | TrialFailed):
            return  # Ready and ArenaOpened come only while a worker starts
        if msg.number == self.in_flight:  # lockstep: the worker waits for the next word
            self.in_flight = None
        p = w.residents.get(msg.number)
        if p is None:
            return
        if isinstance(msg, Report | Done):
            w.overhead_now = msg.overhead
        if isinstance(msg, Report):
            p.started = msg.started
            if len(self.study.directions) == 1 and \
                    metrics.get(self.space.objectives[0].metric).per_round:
                before = rungs_done(frozen(self.study, p.trial)) if self.gated else 0
                p.trial.report(self._value(self.space.objectives[0].metric, msg.metrics, p),
                               msg.round)
                if p.trial.should_prune():
                    rung = failed_rung(frozen(self.study, p.trial), before) \
                        if self.gated else None
                    if rung is None:
                        self._prune(w, p)
                        return
                    p.paused, p.pauses = rung, p.pauses + 1  # the worker holds it, idle
                    self.stats.counts["paused"] += 1
                    self._send(w, Pause(msg.number))
                    self._stack_changed(p)  # a member waits apart, the others go on
                    self._resume_promoted()
                    self._sample()
                    return
                self._resume_promoted()
            if self.gated or self.lockstep:
                self._continue(w, p)
        elif isinstance(msg, Done):
            self._release(w, p, regroup=False)  # its stack's members all end together
            self._note(p.trial, pauses=p.pauses)
            self._note(p.trial, rounds=msg.rounds, switches=msg.switches, busy_s=msg.busy_s,
                       start=msg.started - self.t0, end=msg.ended - self.t0,
                       metrics={k: v for k, v in msg.metrics.items() if k != "train_seconds"},
                       train_seconds=msg.metrics.get("train_seconds", msg.busy_s),
                       ending=True)
            values = [self._value(o.metric, msg.metrics, p) for o in self.space.objectives]
            staged = self.keeper.stage(p.trial.number) if self.keeper and msg.saved else None
            self._tell(p.trial, values if len(values) > 1 else values[0], saved=staged)
            self.stats.counts["complete"] += 1
            if len(values) == 1:
                better = max if self.study.direction.name == "MAXIMIZE" else min
                self.stats.best = values[0] if self.stats.best is None else \
                    better(self.stats.best, values[0])
            self._sample()
        else:
            self._release(w, p)
            # a diverged trial's reason stands alone: the worker had no error
            self._fail(p.trial, msg.reason if msg.reason.startswith("diverged:")
                       else f"error in worker {w.index}: {msg.reason}")

    def _prune(self, w: Worker, p: Placement, regroup: bool = True) -> None:
        self._send(w, Stop(p.trial.number))
        self._release(w, p, regroup=regroup)
        if p.paused is not None:
            self.stats.counts["paused"] -= 1
        start = None if p.started is None else p.started - self.t0
        self._note(p.trial, rounds=frozen(self.study, p.trial).last_step,
                   pauses=p.pauses, start=start, end=time.time() - self.t0, ending=True)
        self._tell(p.trial, state=TrialState.PRUNED)
        self.stats.counts["pruned"] += 1
        self._sample()

    def _resume_promoted(self) -> None:
        """Resume each paused trial that the results so far promote at its rung."""
        for w, p in self._paused():
            assert p.paused is not None
            if promotable(self.study, frozen(self.study, p.trial), p.paused):
                p.paused = None
                self.stats.counts["paused"] -= 1
                self.stats.counts["resumed"] += 1
                self._continue(w, p)
                self._stack_changed(p)  # it goes on; those still paused wait apart

    def _continue(self, w: Worker, p: Placement) -> None:
        """Let a trial waiting after its report run on; in lockstep, when its turn comes
        (:meth:`_go`)."""
        if self.lockstep:
            self.ready.append((w, p))
        else:
            self._send(w, Continue(p.trial.number))

    def _go(self) -> None:
        """Lockstep: when the worker runs nothing, continue one of the trials ready to go
        on, depth first as a worker would pick (the furthest along, then the oldest)."""
        self.ready = [(w, p) for w, p in self.ready
                      if self.workers.get(w.index) is w and p.trial.number in w.residents]
        if self.in_flight is not None or not self.ready:
            return
        w, p = max(self.ready, key=lambda wp: (frozen(self.study, wp[1].trial).last_step or 0,
                                               -wp[1].trial.number))
        self.ready.remove((w, p))
        self.in_flight = p.trial.number
        self._send(w, Continue(p.trial.number))

    @staticmethod
    def _value(metric: str, measured: dict[str, float], p: Placement) -> float:
        return metrics.get(metric).value(measured, p.candidate.heap_bytes)

    def _release(self, w: Worker, p: Placement, regroup: bool = True) -> None:
        """The trial leaves its worker: its region is free, or, for a member of a stack,
        the stack's once no member is left there (until then, with ``regroup``, the
        others are stacked again without it)."""
        w.residents.pop(p.trial.number, None)
        st = p.stack
        if st is None:
            w.free.release(p.offset, p.size)
            self._memory_freed()
            return
        st.held.discard(p.trial.number)
        if st.held:
            if regroup:
                self._stack_changed(p)
        elif not st.regrouping and w.stacks.get(st.number) is st:
            del w.stacks[st.number]
            w.free.release(st.offset, st.size)
            self._memory_freed()

    def _stack_changed(self, p: Placement) -> None:
        """A member of ``p``'s stack left, paused or resumed: regroup it once the
        round's reports are read (:meth:`_regroup_due`)."""
        if p.stack is not None and p.stack.held:
            p.stack.regroup_due = True
            self._regroups_waiting = True

    def _memory_freed(self) -> None:
        """Memory was given back: stacks that found no room to regroup try again."""
        for _, st in self._masked:
            st.regroup_due = True
            self._regroups_waiting = True
        self._masked.clear()

    def _fail(self, trial: optuna.trial.Trial, reason: str, never_started: bool = False,
              retry: bool = False) -> None:
        """Fail ``trial`` with ``reason``; ``retry``: its process died or was interrupted,
        so a trial with its parameters is queued in the storage (it is not counted)."""
        self._note(trial, fail_reason=reason, started=not never_started, ending=True)
        self._tell(trial, state=TrialState.FAIL, retry=retry)
        self.stats.counts["failed"] += 1

    def _crashed(self, w: Worker) -> None:
        if self.workers.get(w.index) is not w:
            return  # already handled
        code = w.process.exitcode
        del self.workers[w.index]
        self.in_flight = None  # lockstep: what it ran went with it
        for p in list(w.residents.values()):
            # once more (unless it already was a repeat), as a queued trial with the
            # same parameters, which the next claim of any driver takes first
            self._fail(p.trial, f"worker {w.index} (pid {w.pid}) died with exit code {code}",
                       retry=not p.requeued)
        self.live.flush()  # the repeats are queued before this driver claims again
        # in the run's summary, which --quiet prints too
        self.stats.notes.append(f"worker {w.index} (pid {w.pid}) died with exit code {code}: "
                                f"its {len(w.residents)} trials failed and were queued again, "
                                "and a new worker took its place")
        replacement = await_ready(self._spawn(w.index))
        s = self.stats
        # what its device's budget leaves beside the other workers there, as it measures
        others = self._host_share(s.tracker) + headroom(self.per_device) + \
            sum(x.overhead + x.arena for x in self.workers.values()
                if x.device == replacement.device)
        open_arena(replacement, min(w.arena, arena_size(
            self.per_device - others - replacement.overhead, self.device)))
        self.workers[replacement.index] = replacement
        s.overheads = [x.overhead for x in self.workers.values()]
        self._sample()
