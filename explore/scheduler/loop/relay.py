"""The loop's traffic: the core's commands carried out (a message to a worker, a record
or an end written to the study by :class:`explore.live.LiveStudy`'s writer thread, a
switched-out trial's file dropped), and the workers' messages
(:mod:`explore.scheduler.protocol`) turned into the core's events; a worker found dead
on the way is replaced."""

from __future__ import annotations

import dataclasses
import time
from multiprocessing.connection import wait
from typing import Any

import optuna

from engine.alignment import align_up
from explore.scheduler import admission
from explore.scheduler.commands import (
    Command,
    DropState,
    Event,
    Failed,
    Finished,
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
from explore.scheduler.loop.startup import Startup
from explore.scheduler.placement import Worker
from explore.scheduler.processes import await_ready, open_arena
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
from explore.study import RECORD_ATTR


class Relay(Startup):
    """Between the core and the rest: its commands out, the workers' messages in."""

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
                       kernels=self.stats.kernels, worker=w.index, device_index=w.device,
                       arena_offset=c.offset,
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
                    validate_every=self.validate_every,
                    refresh_statistics=self.refresh_statistics)
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
