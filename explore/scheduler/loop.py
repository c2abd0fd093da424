"""The run: ask Optuna for trials, size and place them, and tell it what the workers
report, until the study has ``n_trials`` trials that ended (its total, shared with any
other drivers of the study).

The decisions are the core's (:mod:`.core`); this loop only moves messages: it starts
the workers and opens their arenas (sized by :mod:`.admission`), takes candidates from
the intake (:mod:`.intake`), turns the workers' messages (:mod:`explore.scheduler.protocol`) into
the core's events and carries out its commands: a message to a worker, a record or an
end written to the study (by :class:`explore.live.LiveStudy`'s writer thread), a
switched-out trial's file dropped (:mod:`.switched`).
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import time
from multiprocessing.connection import wait
from typing import Any

import optuna

from engine.alignment import align_up
from explore.binding import BoundSpace
from explore.datasets import LoadedData
from explore.keeper import ModelKeeper
from explore.live import REFRESH_EVERY, LiveStudy
from explore.procmem import children, pss
from explore.scheduler import admission
from explore.scheduler.commands import (
    Command,
    DropState,
    Event,
    Failed,
    Finished,
    Idle,
    Interrupted,
    Launch,
    LeftArena,
    Measure,
    Moved,
    Note,
    RegroupedStack,
    Reported,
    Send,
    Tell,
    Tick,
    WorkerDied,
)
from explore.scheduler.constants import Measured, machine_key, workers_that_fit
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import save as save_constants
from explore.scheduler.core import Core
from explore.scheduler.errors import SchedulerError, Stopped
from explore.scheduler.intake import Intake
from explore.scheduler.peak import gemm_peak
from explore.scheduler.placement import Worker
from explore.scheduler.policy import OptunaPolicy
from explore.scheduler.processes import await_ready, open_arena, spawn, stop_all
from explore.scheduler.protocol import (
    Done,
    FromWorker,
    Regrouped,
    Report,
    Start,
    SwitchedOut,
    ToWorker,
    TrialFailed,
)
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.shared_data import share_dataset
from explore.scheduler.signals import StopFlag, catch_stop_signals
from explore.scheduler.stacking import Pending, stacks_for
from explore.scheduler.switched import SwitchFolder
from explore.scheduler.telemetry import MemorySampler, Progress, RunStats, Sample
from explore.scheduler.worker import release_heap_memory
from explore.study import RECORD_ATTR


class Scheduler:
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
    (:mod:`.switched`; default: the system's temporary folder)."""

    def __init__(self, bound: BoundSpace, study: optuna.Study,
                 data: LoadedData | SharedArrays, *,
                 workers: int, memory: int, device: str, devices: list[int] | None = None,
                 progress: Progress | None = None,
                 trials_per_worker: int | None = None, main: int | None = None,
                 keeper: ModelKeeper | None = None, baseline: int = 0,
                 smallest: int | None = None,
                 switch_dir: str | os.PathLike[str] | None = None) -> None:
        space = bound.space
        self.bound, self.space, self.device = bound, space, device
        self.devices = list(devices) if devices else [0]
        self.per_device = memory  # each device's budget
        self.keeper = keeper  # keeps the best trials' weights, if any
        self.switch_dir = switch_dir
        self.switched: SwitchFolder | None = None  # made as the workers start
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
        # in rotation every trial waits for its word after each report: its next turn
        self.gated = self.policy.gated or self.rotation is not None
        self.core = Core(self.policy, self.stats, lockstep=self.lockstep,
                         switching=space.budget.switching, rotation=self.rotation,
                         switch_limit=space.budget.switch_limit,
                         timeout=space.budget.timeout)
        self.timed_out = False  # the run ended at its timeout, short of its trials
        # Trials asked at once and stacked where they can be (explore.scheduler.stacking);
        # not in lockstep, whose point is one trial at a time.
        self.intake = Intake(bound, self.live, self.stats, self.notes, self._fail_new,
                             space.budget.stack if not self.lockstep and
                             self.rotation is None and stacks_for(space)
                             else 1,
                             # a seeded run on one worker: each trial validates in the
                             # chunks it was compiled for, whatever room is left
                             fallbacks=space.sampler.seed is None or
                             workers * len(self.devices) > 1,
                             rows=(self.arrays.spec["y_train"].shape[0],
                                   self.arrays.spec["y_valid"].shape[0]))
        self.remaining = 0
        self.memory = MemorySampler(self.stats, this_process=main is None,
                                    baseline=baseline, device=device)
        self.t0 = time.time()

    # The core's state, as tests and callers read it.
    @property
    def workers(self) -> dict[int, Worker]:
        return self.core.workers

    @property
    def waiting(self) -> list[Pending]:
        return self.core.waiting

    @property
    def stack(self) -> int:
        return self.intake.stack

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
        # first (or by the runner's admission): compiling is part of this process's cost
        smallest = admission.smallest_heap(self.bound) if self.smallest is None else self.smallest
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
        s.headroom = admission.headroom(per) * ndev
        n = min(self.n_workers, workers_that_fit(per - admission.headroom(per),
                                                 self._host_share(known.tracker),
                                                 known.worker,
                                                 admission.admitted_heap(smallest, self.device)))
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
        self.switched = SwitchFolder(self.switch_dir)
        self.stats.switch_folder = str(self.switched.path)
        if self.switched.in_memory and self.device == "cpu" and self.core.switching:
            # there a state out would be memory beside the arenas (which the budget
            # counts whole): switching would add to the run's memory, not free any
            if self.rotation is not None:
                raise SchedulerError(
                    f"budget.in_flight: the trials waiting their turn are switched out "
                    f"to files under {self.switched.path.parent}, which is in memory "
                    f"(tmpfs) that the budget would not hold; set the space's artifacts "
                    f"to a folder on disk")
            self.core.switching = False
            self.stats.notes.append(
                f"paused trials are pruned for room instead of switched out: "
                f"{self.switched.path.parent} is in memory (tmpfs), which the budget "
                f"would not hold; set the space's artifacts to a folder on disk")
        for w in ws:
            open_arena(w, arenas[w.device], str(self.switched.path))
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
        left = per - admission.headroom(per) - self._host_share(self.stats.tracker) - \
            sum(w.overhead for w in ws)
        return admission.arena_size(left // len(ws), self.device)

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

    def _too_small(self, smallest: int, known: Measured) -> str:
        return admission.too_small(budget=self.per_device, devices=len(self.devices),
                         device=self.device, smallest=smallest, known=known,
                         host_share=self._host_share(known.tracker), main=self.stats.main,
                         data=self.stats.data)

    def stop(self) -> None:
        stop_all(self.workers.values())
        self.arrays.close()
        if self.switched is not None:
            self.switched.close()

    # -- accounting ----------------------------------------------------------------------
    def _sample(self) -> None:
        self.stats.record(Sample(time.time() - self.t0, self.core.heaps(), self.stats.fixed,
                                 len(self.waiting), self.remaining))
        self.memory.measure(self.workers.values())
        self.stats.counts["running"] = self.core.in_hand()
        self.stats.counts["waiting"] = len(self.waiting)
        self.progress(self.stats)

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
                while time.time() >= next_claim and self._asks():
                    asked = time.perf_counter()
                    more, pendings = self.intake.ask()
                    self.stats.asking_s += time.perf_counter() - asked
                    for pend in pendings:
                        self.core.waiting.append(pend)
                    if not more:
                        next_claim = time.time() + REFRESH_EVERY / 4
                        break
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
        held = sum(len(w.residents) for w in self.workers.values()) + len(self.core.out)
        self._tell_core(Interrupted())
        by = Stopped(self.stop_flag.signum).name
        self.stats.notes.append(f"interrupted ({by}): {held} trials in hand failed and "
                                "queued again for the next run")

    # -- carrying out the core's commands --------------------------------------------------
    def _tell_core(self, event: Event) -> None:
        self._do(self.core.handle(event))

    def _fail_new(self, trial: optuna.trial.Trial, reason: str) -> None:
        """The intake's word: ``trial`` fails before it started."""
        self.core.fail(trial, reason, never_started=True)
        self._do(self.core.take())

    def _do(self, commands: list[Command]) -> None:
        """Carry out ``commands`` in order; a worker found dead on the way is handled
        once they are done (its trials fail and are queued again)."""
        dead: list[Worker] = []
        for c in commands:
            match c:
                case Launch():
                    self._launch(c, dead)
                case Send(worker=i, msg=msg):
                    w = self.workers.get(i)
                    if w is not None and w not in dead and not self._send(w, msg):
                        dead.append(w)
                case Note(trial=trial, values=values, write=write, ending=ending):
                    self._note(trial, write=write, ending=ending, **values)
                case Moved(number=n, move=move):
                    self.notes.setdefault(n, {}).setdefault("moves", []).append(move)
                case DropState(number=n):
                    if self.switched is not None:
                        self.switched.discard(n)
                case Tell(trial=trial, values=values, state=state, retry=retry, saved=saved):
                    staged = self.keeper.stage(trial.number) if self.keeper and saved else None
                    keep = self.keeper.keeping(staged) if self.keeper and staged else None
                    self.live.finish(trial, values, state=state, retry=retry, keep=keep)
                case Measure():
                    self._sample()
        for w in dead:
            self._crashed(w)

    def _launch(self, c: Launch, dead: list[Worker]) -> None:
        """Record where the candidate goes and send it there (the worker starts it)."""
        w, pend, prog, stack = self.workers[c.worker], c.pending, c.program, c.stack
        cand, size = pend.candidate, align_up(prog.total_bytes)
        for k, trial in enumerate(pend.trials):
            extra: dict[str, Any] = {} if stack is None else \
                {"stack": {"models": len(pend.trials), "model": k,
                           "trials": list(stack.members)}}
            self._note(trial, planned_bytes=prog.zone_bytes, total_bytes=prog.total_bytes,
                       batch_size=cand.train_batch, compiled_batch=prog.batch_size,
                       worker=w.index, device_index=w.device, arena_offset=c.offset,
                       placed_at=time.time() - self.t0, write=True, **extra)
        first = pend.trials[0]
        seed = self.space.budget.seed + self.live.stored_number(first)
        saves = [self.keeper.stage(t.number) if self.keeper else None for t in pend.trials]
        msg = Start(first.number if stack is None else stack.number, prog, c.offset,
                    seed, self.space.budget.rounds, cand.train_batch,
                    self.gated or self.lockstep, self.target_std,
                    saves[0] if stack is None else None,
                    members=() if stack is None else stack.members,
                    member_save_to=() if stack is None else tuple(saves),
                    validate_every=self.validate_every)
        if w in dead or not self._send(w, msg):
            self.core.unplace(w.index, pend, stack, c.offset, size)  # it waits again
            if w not in dead:
                dead.append(w)

    def _send(self, w: Worker, msg: ToWorker) -> bool:
        """Send; False when the worker is gone."""
        try:
            w.conn.send(msg)
            return True
        except (BrokenPipeError, EOFError, OSError):
            w.process.join(timeout=5)
            return False

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

    # -- the workers' messages -------------------------------------------------------------
    def _events(self) -> None:
        by: dict[Any, Worker] = {w.conn: w for w in self.workers.values()}
        by.update({w.process.sentinel: w for w in self.workers.values()})
        for ready in wait(list(by), timeout=1.0):  # Ctrl-C is seen within 1 s
            w = by.get(ready)
            if w is None or self.workers.get(w.index) is not w:  # gone since
                continue
            try:
                while w.conn.poll(0):
                    self._handle(w, w.conn.recv())
            except (EOFError, OSError):
                pass
            if not w.process.is_alive():
                self._crashed(w)

    def _handle(self, w: Worker, msg: FromWorker) -> None:
        """A worker's message as the core's event (its times made the run's)."""
        self._tell_core(Tick(time.time() - self.t0))
        if isinstance(msg, Regrouped):
            self._tell_core(RegroupedStack(w.index, msg.number))
        elif isinstance(msg, SwitchedOut):
            self._tell_core(LeftArena(w.index, msg))
        elif isinstance(msg, Report):
            self._tell_core(Reported(w.index, dataclasses.replace(
                msg, started=msg.started - self.t0)))
        elif isinstance(msg, Done):
            self._tell_core(Finished(w.index, dataclasses.replace(
                msg, started=msg.started - self.t0, ended=msg.ended - self.t0)))
        elif isinstance(msg, TrialFailed):
            self._tell_core(Failed(w.index, msg))
        # Ready and ArenaOpened come only while a worker starts

    def _crashed(self, w: Worker) -> None:
        if self.workers.get(w.index) is not w:
            return  # already handled
        code = w.process.exitcode
        self._tell_core(WorkerDied(w.index, code, w.pid))
        self.live.flush()  # the repeats are queued before this driver claims again
        # in the run's summary, which --quiet prints too
        self.stats.notes.append(f"worker {w.index} (pid {w.pid}) died with exit code {code}: "
                                f"its {len(w.residents)} trials failed and were queued again, "
                                "and a new worker took its place")
        replacement = await_ready(self._spawn(w.index))
        s = self.stats
        # what its device's budget leaves beside the other workers there, as it measures
        others = self._host_share(s.tracker) + admission.headroom(self.per_device) + \
            sum(x.overhead + x.arena for x in self.workers.values()
                if x.device == replacement.device)
        open_arena(replacement, min(w.arena, admission.arena_size(
            self.per_device - others - replacement.overhead, self.device)),
            str(self.switched.path) if self.switched else "")
        self.core.add_worker(replacement)
        s.overheads = [x.overhead for x in self.workers.values()]
        self._sample()


def machine_peak(device: str) -> float | None:
    """The machine's GEMM peak in FLOP/s as measured before, outside any run
    (:func:`explore.scheduler.peak.gemm_peak`, or ``$EXPLORE_GEMM_PEAK``), or None: the
    run's figures then go without it.  A run never times products itself: their
    operands would spend its budget (workers may still be exiting when it ends)."""
    try:
        return gemm_peak(device, None, measure=False)
    except Exception:  # a utilisation figure never fails a run
        return None
