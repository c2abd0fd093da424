"""The packing scheduler: exact sizes in, as many trials at once as memory allows.

Memory is accounted, never guessed: the budget covers the data set (held once, in
shared memory), each worker's fixed overhead (measured by the worker at start-up)
and the workers' arenas, split evenly among them and allocated once.  Every
candidate is compiled before anything runs, so its heap is known to the byte; it goes
to the least busy worker with room, into the free segment of its arena that it leaves
the least of (best fit); with ``budget.trials_per_worker`` above one, several trials
share a worker's arena side by side (the worker runs them a round at a time, depth
first).  A candidate that cannot fit even an empty arena at batch 1 is told to Optuna
as failed, with the reason, and costs no training time.  The sum of
what is placed never exceeds the budget: the accounting is checked on every change.

A worker that dies takes its trials with it: they are recorded as failed with the
reason, enqueued once more, and a new worker takes its place.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import optuna
from optuna.trial import TrialState

from engine import BudgetError
from engine.alignment import align_down, align_up
from engine.free_list import FreeList
from explore.builders import BuildError
from explore.candidate import PIXEL_SCALE, Candidate, compile_candidate
from explore.data import Dataset, quantize
from explore.protocol import (
    Continue,
    Done,
    Exit,
    FromWorker,
    OpenArena,
    Pause,
    Ready,
    Report,
    Start,
    Stop,
    ToWorker,
    TrialFailed,
)
from explore.rungs import failed_rung, pauses, promotable, rungs_done
from explore.sampling import suggest
from explore.shared import SharedArrays
from explore.space import Space
from explore.study import PARAMS_ATTR, RECORD_ATTR, StudyWriter, frozen, working_copy
from explore.worker import main as worker_main
from explore.worker import rss_bytes

# Resident sizes are read from /proc at most this often (seconds): a read is ~0.1 ms
# per process, and the accounting is sampled after every event (5 a second per
# worker on the paper's space); resident memory changes slowly.
RSS_EVERY = 0.2


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _thread_share(workers: int) -> Any:
    """Give each spawned worker its share of the cores for BLAS (unless the user set
    the thread counts): W workers each using every core would fight over them."""
    cores = os.cpu_count() or 1
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    for k in THREAD_VARS:
        if saved[k] is None:
            os.environ[k] = str(max(1, cores // workers))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


@contextlib.contextmanager
def _main_left_behind() -> Any:
    """Start spawned workers without re-importing the parent's ``__main__``.

    By default a spawned child runs the parent's main script (as ``__mp_main__``) so
    that objects defined there unpickle; a worker needs none of it (its target is
    :func:`explore.worker.main`), yet would hold everything that script imports: for
    a script importing optuna it measured 42 MB of PSS per worker instead of 25 MB, all
    of it charged to the budget as fixed overhead.  ``multiprocessing`` skips a main
    module whose spec is named ``__main__`` (as it does for ``python -m pkg``), so the
    spec says so while the worker starts."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = saved


class SchedulerError(Exception):
    """The run cannot start (a budget too small for its workers, ...)."""


@dataclass
class Placement:
    trial: optuna.trial.Trial
    candidate: Candidate
    worker: int
    offset: int
    size: int
    placed_at: float
    requeued: bool = False
    paused: int | None = None  # the rung it waits at (explore.rungs), if paused
    pauses: int = 0
    started: float | None = None  # when its worker took it (from its first report)


@dataclass
class Worker:
    index: int
    process: Any
    conn: Connection
    overhead: int = 0
    arena: int = 0
    pid: int = 0
    free: FreeList = field(default_factory=FreeList)  # the arena's free segments, mirrored
    residents: dict[int, Placement] = field(default_factory=dict)


@dataclass
class Sample:
    """The accounting at one moment (the packing timeline)."""

    t: float
    heaps: int  # bytes of trial heaps placed
    fixed: int  # data and worker overheads
    waiting: int  # candidates compiled and waiting for room
    remaining: int = 0  # trials not yet asked


@dataclass
class RunStats:
    budget: int
    arena: int = 0
    data: int = 0
    overheads: list[int] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    rss_peak: int = 0  # measured: the scheduler's and the workers' resident memory, summed
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("complete", "pruned", "failed", "running", "waiting", "paused", "resumed"), 0))
    best: float | None = None

    @property
    def peak(self) -> int:
        return max((s.heaps + s.fixed for s in self.timeline), default=0)

    def packing_efficiency(self, of: int | None = None) -> float | None:
        """Time-weighted mean fraction of the budget (or of ``of`` bytes) held by trial
        heaps while trials were waiting: compiled and waiting for room, or not yet
        asked (None if the run never had any)."""
        num = den = 0.0
        for a, b in zip(self.timeline, self.timeline[1:], strict=False):
            if a.waiting or a.remaining:
                num += (b.t - a.t) * a.heaps / (of or self.budget)
                den += b.t - a.t
        return num / den if den else None


Progress = Callable[[RunStats], None]


class Scheduler:
    """Runs ``n_trials`` more trials of ``study`` on ``workers`` processes."""

    def __init__(self, space: Space, study: optuna.Study, data: Dataset, *, workers: int,
                 memory: int, device: str, progress: Progress | None = None,
                 depth: int | None = None) -> None:
        self.space, self.device = space, device
        self.stored = study  # where finished trials go, one write each
        self.study = working_copy(study, space)  # what the sampler and pruner consult
        self.n_workers = workers
        # Trials a worker holds at once: by default one running and one ready (the
        # worker starts it only when the other ends), which keeps the sampler and the
        # pruner about as well informed as a sequential search; more packs memory.
        self.depth = max(1, depth if depth is not None else space.budget.trials_per_worker)
        self.stats = RunStats(memory)
        self.progress = progress or (lambda s: None)
        train = data.train
        if space.dataset.train:
            train = train.head(space.dataset.train)
        valid = data.valid.head(space.dataset.valid) if space.dataset.valid else data.valid
        scale = PIXEL_SCALE.get(space.dataset.name)
        xt, xv = (quantize(train.x, scale), quantize(valid.x, scale)) if scale else \
            (train.x, valid.x)
        self.arrays = SharedArrays({"x_train": xt, "y_train": train.y,
                                    "x_valid": xv, "y_valid": valid.y})
        self.stats.data = self.arrays.nbytes if device == "cpu" else 0
        self.ctx = mp.get_context("spawn")
        self.workers: dict[int, Worker] = {}
        self.waiting: list[tuple[optuna.trial.Trial, Candidate, bool]] = []
        self.notes: dict[int, dict[str, Any]] = {}
        # A rung pruner's trials wait for its word after each report, so that one it
        # would stop can be paused at the rung instead (explore.rungs).
        self.gated = space.pruner.pause and len(self.study.directions) == 1 and \
            pauses(self.study.pruner)
        self.remaining = 0
        self._rss_at = -RSS_EVERY
        self.t0 = time.time()

    # -- workers -------------------------------------------------------------------------
    def _spawn(self, index: int) -> Worker:
        """Start a worker (it reports its overhead later: see :meth:`_ready`)."""
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker_main, args=(child, self.arrays.spec, self.device),
                                name=f"explore-worker-{index}", daemon=True)
        with _thread_share(self.n_workers), _main_left_behind():
            proc.start()
        child.close()
        return Worker(index, proc, parent)

    def _ready(self, w: Worker) -> Worker:
        msg = self._recv(w, timeout=120)
        assert isinstance(msg, Ready), msg
        w.overhead, w.pid = msg.overhead, msg.pid
        return w

    def _recv(self, w: Worker, timeout: float) -> FromWorker:
        try:
            if w.conn.poll(timeout):
                return w.conn.recv()
        except (EOFError, OSError):
            w.process.join(timeout=5)
            raise SchedulerError(f"worker {w.index} exited while starting (exit code "
                                 f"{w.process.exitcode})") from None
        raise SchedulerError(f"worker {w.index} did not answer in {timeout:.0f} s")

    def start(self) -> None:
        ws = [self._spawn(i) for i in range(self.n_workers)]  # they start up in parallel
        for w in ws:
            self.workers[w.index] = w  # known to stop() from now on
        for w in ws:
            self._ready(w)
        fixed = self.stats.data + sum(w.overhead for w in ws)
        arena = align_down((self.stats.budget - fixed) // len(ws))
        if arena <= 0:
            raise SchedulerError(
                f"a budget of {self.stats.budget:,} bytes leaves nothing for trials: the data "
                f"takes {self.stats.data:,} and {len(ws)} worker(s) {fixed - self.stats.data:,}"
                " bytes of fixed overhead; raise budget.memory or lower budget.workers")
        for w in ws:
            self._open_arena(w, arena)
        self.stats.arena = arena
        self.stats.overheads = [w.overhead for w in ws]
        self._sample()

    def _open_arena(self, w: Worker, nbytes: int) -> None:
        w.conn.send(OpenArena(nbytes))
        self._recv(w, timeout=120)
        w.arena = nbytes
        w.free = FreeList([(0, nbytes)])
        self.workers[w.index] = w

    def stop(self) -> None:
        for w in self.workers.values():
            with contextlib.suppress(BrokenPipeError, OSError):
                w.conn.send(Exit())
        for w in self.workers.values():
            w.process.join(timeout=10)
            if w.process.is_alive():
                w.process.kill()
        self.arrays.close()

    # -- accounting ----------------------------------------------------------------------
    def _sample(self) -> None:
        heaps = sum(p.size for w in self.workers.values() for p in w.residents.values())
        fixed = self.stats.data + sum(w.overhead for w in self.workers.values())
        if heaps + fixed > self.stats.budget:
            raise AssertionError(f"placed {heaps + fixed:,} bytes over a budget of "
                                 f"{self.stats.budget:,}")
        self.stats.timeline.append(Sample(time.time() - self.t0, heaps, fixed,
                                          len(self.waiting), self.remaining))
        self._measure_rss()
        self.stats.counts["running"] = self._in_hand()
        self.stats.counts["waiting"] = len(self.waiting)
        self.progress(self.stats)

    def _measure_rss(self, now: bool = False) -> None:
        t = time.monotonic()
        if now or t - self._rss_at >= RSS_EVERY:
            self._rss_at = t
            rss = rss_bytes() + sum(rss_bytes(w.pid) for w in self.workers.values())
            self.stats.rss_peak = max(self.stats.rss_peak, rss)

    # -- the run ---------------------------------------------------------------------------
    def run(self, n_trials: int) -> RunStats:
        self.writer = StudyWriter(self.stored)
        try:
            self.remaining = n_trials
            self.start()
            asked = 0
            while True:
                # Ask while what was asked last found room and each worker has at most
                # `depth` trials in hand: candidates wait only when memory is full, and
                # the sampler is not asked far ahead of the results it learns from.
                while asked < n_trials and not self.waiting and self._in_hand() < \
                        self.depth * len(self.workers):
                    asked += 1
                    self.remaining = n_trials - asked
                    self._ask()
                    self._place()
                if not self.waiting and not any(w.residents for w in self.workers.values()):
                    if asked >= n_trials:
                        self._measure_rss(now=True)  # the arenas at their fullest
                        break
                    continue
                if not any(_active(w) for w in self.workers.values()):
                    # Only paused trials are held, and nothing runs that could promote
                    # them: a waiting trial needs the memory of the one paused longest
                    # (passed over by every result since), or the run is over for all.
                    paused = self._paused()
                    for w, p in paused[:1] if self.waiting else paused:
                        self._prune(w, p)
                    self._place()
                    continue
                self._events()
                self._place()
        finally:
            self.stop()
            self.writer.close()
        return self.stats

    def _note(self, trial: optuna.trial.Trial, write: bool = False, **values: Any) -> None:
        """Collect what a trial records; write it as one user attribute (``explore``) when
        asked: one storage transaction rather than one per value."""
        record = self.notes.setdefault(trial.number, {})
        record.update(values)
        if write:
            trial.set_user_attr(RECORD_ATTR, record)

    def _tell(self, trial: optuna.trial.Trial, values: Any = None,
              state: TrialState | None = None) -> None:
        self.study.tell(trial, values, state=state)
        self.writer.put(frozen(self.study, trial))

    def _in_hand(self) -> int:
        """Trials held and not paused: what the sampler's look-ahead is counted in."""
        return sum(_active(w) for w in self.workers.values())

    def _paused(self) -> list[tuple[Worker, Placement]]:
        return sorted(((w, p) for w in self.workers.values() for p in w.residents.values()
                       if p.paused is not None), key=lambda wp: wp[1].trial.number)

    def _ask(self, requeued: bool = False) -> None:
        trial = self.study.ask()
        params = suggest(trial, self.space)
        self.notes.setdefault(trial.number, {})[PARAMS_ATTR] = params
        try:
            cand = compile_candidate(self.space, params, self.stats.arena)
        except (BudgetError, BuildError) as e:
            self._fail(trial, f"does not fit: {e}" if isinstance(e, BudgetError) else str(e),
                       never_started=True)
            return
        self.waiting.append((trial, cand, requeued))

    def _place(self) -> None:
        still = []
        batch, self.waiting = self.waiting, []  # a worker dying below may re-queue into it
        for trial, cand, requeued in batch:
            # The least busy worker that has room, then best fit within it: packing
            # by memory alone piled every trial into one worker while the other idled.
            # Where the preferred program fits nowhere, the one compiled at the
            # training batch may still fit a gap (validation then runs in smaller
            # chunks): the trial starts now instead of waiting for a bigger hole.
            for prog in cand.fitting():
                size = align_up(prog.total_bytes)
                fits = [(_active(w), seg - size, offset, w.index)
                        for w in self.workers.values()
                        if (fit := w.free.best_fit(size)) is not None
                        for offset, seg in [fit]]
                if fits:
                    break
            if not fits:
                still.append((trial, cand, requeued))
                continue
            _, _, offset, index = min(fits)
            w = self.workers[index]
            w.free.take(offset, size)
            w.residents[trial.number] = Placement(trial, cand, index, offset, size, time.time(),
                                                  requeued)
            self._note(trial, planned_bytes=prog.zone_bytes, total_bytes=prog.total_bytes,
                       batch_size=cand.train_batch, compiled_batch=prog.batch_size,
                       worker=index, arena_offset=offset,
                       placed_at=time.time() - self.t0, write=True)
            seed = self.space.budget.seed + trial.number
            # The Program itself: pickled by the pipe in 0.05 ms, where its JSON took
            # 0.7 ms, on the scheduler's thread, while it fills the arenas.
            if not self._send(w, Start(trial.number, prog, offset, seed,
                                       self.space.budget.rounds, cand.train_batch, self.gated)):
                still.append((trial, cand, requeued))  # its placement went with the worker
        self.waiting = still + self.waiting
        self._sample()

    def _send(self, w: Worker, msg: ToWorker) -> bool:
        """Send, or handle the worker's death (its residents fail and are re-queued)."""
        try:
            w.conn.send(msg)
            return True
        except (BrokenPipeError, EOFError, OSError):
            w.process.join(timeout=5)
            if isinstance(msg, Start):
                p = w.residents.pop(msg.number)
                w.free.release(p.offset, p.size)
            self._crashed(w)
            return False

    def _events(self) -> None:
        conns = {w.conn: w for w in self.workers.values()}
        sentinels = {w.process.sentinel: w for w in self.workers.values()}
        for ready in wait([*conns, *sentinels], timeout=5.0):
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
        if not isinstance(msg, Report | Done | TrialFailed):
            return  # Ready and ArenaOpened come only while a worker starts
        p = w.residents.get(msg.number)
        if p is None:
            return
        if isinstance(msg, Report):
            p.started = msg.started
            if len(self.study.directions) == 1 and self.space.objectives[0].metric != \
                    "planned_bytes":
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
                    self._resume_promoted()
                    self._sample()
                    return
                self._resume_promoted()
            if self.gated:
                self._send(w, Continue(msg.number))
        elif isinstance(msg, Done):
            self._release(w, p)
            self._note(p.trial, pauses=p.pauses)
            self._note(p.trial, rounds=msg.rounds, switches=msg.switches, busy_s=msg.busy_s,
                       start=msg.started - self.t0, end=msg.ended - self.t0,
                       accuracy=msg.metrics["accuracy"], write=True)
            values = [self._value(o.metric, msg.metrics, p) for o in self.space.objectives]
            self._tell(p.trial, values if len(values) > 1 else values[0])
            self.stats.counts["complete"] += 1
            if len(values) == 1:
                better = max if self.study.direction.name == "MAXIMIZE" else min
                self.stats.best = values[0] if self.stats.best is None else \
                    better(self.stats.best, values[0])
            self._sample()
        else:
            self._release(w, p)
            self._fail(p.trial, f"error in worker {w.index}: {msg.reason}")

    def _prune(self, w: Worker, p: Placement) -> None:
        self._send(w, Stop(p.trial.number))
        self._release(w, p)
        if p.paused is not None:
            self.stats.counts["paused"] -= 1
        start = None if p.started is None else p.started - self.t0
        self._note(p.trial, rounds=frozen(self.study, p.trial).last_step,
                   pauses=p.pauses, start=start, end=time.time() - self.t0, write=True)
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
                self._send(w, Continue(p.trial.number))

    @staticmethod
    def _value(metric: str, metrics: dict[str, float], p: Placement) -> float:
        if metric == "accuracy":
            return metrics["accuracy"]
        if metric == "loss":
            return metrics["eval_loss"]
        return float(p.candidate.heap_bytes)

    def _release(self, w: Worker, p: Placement) -> None:
        w.residents.pop(p.trial.number, None)
        w.free.release(p.offset, p.size)

    def _fail(self, trial: optuna.trial.Trial, reason: str, never_started: bool = False
              ) -> None:
        self._note(trial, fail_reason=reason, started=not never_started, write=True)
        self._tell(trial, state=TrialState.FAIL)
        self.stats.counts["failed"] += 1

    def _crashed(self, w: Worker) -> None:
        if self.workers.get(w.index) is not w:
            return  # already handled
        code = w.process.exitcode
        del self.workers[w.index]
        for p in list(w.residents.values()):
            self._fail(p.trial, f"worker {w.index} (pid {w.pid}) died with exit code {code}")
            if not p.requeued:  # once more, as a new trial with the same parameters
                self.study.enqueue_trial(p.trial.params, user_attrs={"requeued_from":
                                                                     p.trial.number})
                self._ask(requeued=True)
        replacement = self._ready(self._spawn(w.index))
        others = self.stats.data + sum(x.overhead + x.arena for x in self.workers.values())
        self._open_arena(replacement, min(self.stats.arena, align_down(
            self.stats.budget - others - replacement.overhead)))
        self._sample()


def _active(w: Worker) -> int:
    """Trials of ``w`` that run or are ready to (not paused at a rung)."""
    return sum(p.paused is None for p in w.residents.values())
