""":class:`Core`: the events it decides on (:meth:`Core.handle`), a worker's messages
(a report and the pruner's word on it, a trial's end or failure, a worker's death), the
run gone idle, and Ctrl-C.  The other decisions are its layers', one module each
(see :mod:`explore.scheduler.core`)."""

from __future__ import annotations

import math

from engine.free_list import FreeList
from explore.scheduler.commands import (
    Admitted,
    Command,
    DropState,
    Event,
    Failed,
    Finished,
    Idle,
    Interrupted,
    LeftArena,
    Measure,
    Note,
    RegroupedStack,
    Reported,
    Send,
    Tell,
    Tick,
    WorkerDied,
)
from explore.scheduler.core.endings import BY_PRUNER, FOR_ROOM, NOT_PROMOTED
from explore.scheduler.core.placing import Placing
from explore.scheduler.placement import Placement, Worker
from explore.scheduler.policy import PRUNE
from explore.scheduler.protocol import SECONDS, Done, Pause, Report, TrialFailed

# How a trial in hand when the run was stopped (Ctrl-C, SIGTERM, SIGHUP) fails: it is
# queued again and not counted (explore run's last words count them by it).
INTERRUPTED = "interrupted"


class Core(Placing):
    """The decisions of one driver's run, within the budget and the measured bytes of
    ``stats`` (whose counts and best value it keeps); ``lockstep``: one trial runs at a
    time, continued round by round in an order that depends on nothing but the events
    (reproducible runs); ``part``: compiles a stack's members as a program of their own
    (regrouping).  ``switching``: paused trials whose room is needed leave for a file
    (False: the one paused longest is pruned instead, and nothing is written out).
    ``rotation`` (the budget's ``in_flight``): up to that many trials are held at once,
    more than the arenas hold, and advanced in turn (:meth:`_rotate`).
    ``switch_limit``: the most bytes of switched-out states at once (None: no limit).
    ``timeout`` (the budget's): the seconds after which no new trial is taken
    (:meth:`takes_new`).  Times (``Tick``, the workers' stamps) are seconds since the
    run began."""

    # -- the interface -------------------------------------------------------------------
    def handle(self, event: Event) -> list[Command]:
        """Decide on ``event``; the commands it leads to, in order."""
        match event:
            case Tick(now=now):
                self.now = now
            case Admitted(pending=pending, ahead=ahead):
                (self.ahead if ahead else self.waiting).append(pending)
            case Reported(worker=i, msg=msg):
                self._reported(self.workers.get(i), msg)
            case Finished(worker=i, msg=msg):
                self._finished(self.workers.get(i), msg)
            case Failed(worker=i, msg=msg):
                self._failed(self.workers.get(i), msg)
            case RegroupedStack(worker=i, number=n):
                self._regrouped(self.workers.get(i), n)
            case LeftArena(worker=i, msg=msg):
                self._left(self.workers.get(i), msg)
            case WorkerDied(worker=i, exitcode=code, pid=pid):
                self._died(i, code, pid)
            case Idle():
                self._idle()
            case Interrupted():
                self._interrupted()
        return self.take()

    def _arrived(self, w: Worker | None, number: int) -> Placement | None:
        if number == self.in_flight:  # lockstep: the worker waits for the next word
            self.in_flight = None
        if w is not None and self.running.get(w.index) == number:
            del self.running[w.index]  # rotation: its worker is free for the next turn
        return None if w is None else w.residents.get(number)

    def _reported(self, w: Worker | None, msg: Report) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        p.started, p.rounds = msg.started, msg.round
        p.seconds = {k: msg.metrics[k] for k in SECONDS if k in msg.metrics}
        p.validated += msg.validated
        # a round not validated has nothing for the pruner: the trial goes on
        verdict = self.policy.report(p.trial, msg.round, msg.metrics,
                                     p.candidate.heap_bytes) if msg.validated else None
        if verdict == PRUNE:
            self._prune(w, p, BY_PRUNER)
            # its value at the rung counts there too (Optuna records it before pruning):
            # it may promote a trial paused there, which would otherwise wait for the
            # next report, or be pruned at the end if none came
            self._resume_promoted()
            return
        if verdict is not None:
            p.paused, p.pauses = int(verdict), p.pauses + 1  # the worker holds it, idle
            self._emit(Send(w.index, Pause(msg.number)))
            self._stack_changed(p)  # a member waits apart, the others go on
            self._resume_promoted()
            self._emit(Measure())
            return
        self._resume_promoted()
        if self.policy.gated or self.turns:
            self._continue(w, p)

    def _finished(self, w: Worker | None, msg: Done) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        w.overhead_now = msg.overhead
        self._spent(w, msg.spent)
        self._release(w, p, regroup=False)  # its stack's members all end together
        self._emit(Note(p.trial, {"pauses": p.pauses, "rounds": msg.rounds,
                                  "switches": msg.switches,
                                  "busy_s": msg.busy_s, "start": msg.started,
                                  "end": msg.ended,
                                  "metrics": {k: v for k, v in msg.metrics.items()
                                              if k not in SECONDS},
                                  "train_seconds": msg.metrics.get("train_seconds",
                                                                   msg.busy_s),
                                  "valid_seconds": msg.metrics.get("valid_seconds", 0.0),
                                  **self._work(p, msg.rounds, p.validated + 1),
                                  **({"model_error": msg.model_error} if msg.model_error
                                     else {}),
                                  **self._switch_record(p)},
                        ending=True))
        values = self.policy.values(msg.metrics, p.candidate.heap_bytes)
        if not all(math.isfinite(v) for v in values):
            # Optuna would fail it without a word: the reason is said here
            odd = ", ".join(f"{k} {v}" for k, v in msg.metrics.items()
                            if k not in SECONDS and not math.isfinite(v))
            self.fail(p.trial, f"its objective value is {', '.join(map(str, values))} after "
                      f"round {msg.rounds} ({odd or 'no metric is'} not finite): a metric "
                      "the validation rows cannot give (NaN: one class, a constant target) "
                      "or that has no bound there (inf)", saved=msg.saved)
            self._emit(Measure())
            return
        self._emit(Tell(p.trial, values if len(values) > 1 else values[0],
                        saved=msg.saved))
        self.counts["complete"] += 1
        if len(values) == 1:
            self.stats.best = self.policy.best(self.stats.best, values[0])
        self._emit(Measure())

    def _failed(self, w: Worker | None, msg: TrialFailed) -> None:
        p = self._arrived(w, msg.number)
        if w is None or p is None:
            return
        self._release(w, p)
        # a diverged trial's reason stands alone: the worker had no error
        self.fail(p.trial, msg.reason if msg.reason.startswith("diverged:")
                  else f"error in worker {w.index}: {msg.reason}")

    def _died(self, index: int, code: int | None, pid: int) -> None:
        """A worker's trials fail and, once more (unless they already were a repeat), are
        queued with the same parameters, which the next claim of any driver takes first."""
        w = self.workers.pop(index, None)
        if w is None:
            return  # already handled
        self.in_flight = None  # lockstep: what it ran went with it
        self.running.pop(index, None)
        for p in list(w.residents.values()):
            self.fail(p.trial, f"worker {index} (pid {pid}) died with exit code {code}",
                      retry=not p.requeued)

    def _idle(self) -> None:
        """Nothing runs and nothing is on its way (:meth:`idle`).  In lockstep the trial
        whose turn it is comes back in (:meth:`_turn`).  A trial that waits for room
        that :meth:`_make_room` could not make in any single arena has every idle trial
        switched out for it (:meth:`_make_way`).  With nothing waiting, no result can
        come to promote the paused trials any more: the run is over for them."""
        if self._in_transit():
            return
        if self.turns and self.ready:
            before = len(self._out)
            self._rotate() if self.rotation is not None else self._turn()
            if len(self._out) > before:
                return
        paused = self.paused()
        if not self.switching:  # the memory of the one paused longest, passed over by
            # every result since, is needed
            for w, p in paused[:1] if self.waiting else paused:
                self._prune(w, p, FOR_ROOM if self.waiting else NOT_PROMOTED)
            return
        if self.waiting or self.ready or any(p.paused is None for p in self.out.values()):
            self._make_way()
            return
        for w, p in paused:
            self._prune(w, p, NOT_PROMOTED)

    def _interrupted(self) -> None:
        held = [p.trial for w in self.workers.values() for p in w.residents.values()]
        for n in self.out:
            self._emit(DropState(n))
        held += [p.trial for p in self.out.values()]
        for trial in held:
            self.fail(trial, INTERRUPTED, retry=True)
        for trial in [t for pend in self.waiting + self.ahead for t in pend.trials]:
            self.fail(trial, INTERRUPTED, never_started=True, retry=True)
        self.waiting, self.ahead, self.out = [], [], {}
        for w in self.workers.values():  # the run ends: nothing is held any more
            w.residents.clear()
            w.stacks.clear()
            w.free = FreeList([(0, w.arena)])
        self.ready, self.in_flight = [], None
        self.running.clear()

    def _resume_promoted(self) -> None:
        """Resume each paused trial that the results so far promote at its rung; one
        switched out (or on its way out) comes back into an arena with room first: in
        its turn (lockstep, :meth:`go`), else before new candidates (:meth:`place`)."""
        for w, p in self.paused():
            assert p.paused is not None
            if self.policy.promotable(p.trial, p.paused):
                p.paused = None
                self.counts["resumed"] += 1
                if w is None or p.leaving:
                    if self.turns:
                        self.ready.append(p)
                    continue
                self._continue(w, p)
                self._stack_changed(p)  # it goes on; those still paused wait apart
