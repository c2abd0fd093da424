"""How a trial ends here, and what its record says: failed (with its reason, queued
again where its process died or the run was interrupted), failed for want of room the
processes' growth took, or pruned (stopped in its worker, or its switched-out state
dropped), with the work it did and its switches out of an arena."""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

from explore.scheduler.commands import DropState, Measure, Note, Send, Tell
from explore.scheduler.core.regions import Regions
from explore.scheduler.placement import Placement, Worker
from explore.scheduler.protocol import Stop
from explore.scheduler.stacking import Pending

# Why a trial was pruned, as its record says (``pruned``): the pruner's word on a
# report; paused at a rung and never promoted before the run ended (or its timeout);
# the memory it held was needed and it could not wait out of the arena
# (``budget.switching: false``, ``budget.switch_limit`` reached, no folder on disk).
BY_PRUNER = "by the pruner"
NOT_PROMOTED = "paused, not promoted"
FOR_ROOM = "for room"


class Endings(Regions):
    """Ends trials as failed or pruned, with the notes and tells that say so, and keeps
    the run's counts and figures (FLOPs) of them."""

    def fail(self, trial: Any, reason: str, never_started: bool = False,
             retry: bool = False, saved: bool = False) -> None:
        """Fail ``trial`` with ``reason``; ``retry``: its process died or was interrupted,
        so a trial with its parameters is queued in the storage (it is not counted);
        ``saved``: its worker wrote its weights, which the writer then discards."""
        self._emit(Note(trial, {"fail_reason": reason, "started": not never_started},
                        ending=True),
                   Tell(trial, state=TrialState.FAIL, retry=retry, saved=saved))
        self.counts["failed"] += 1

    def _fail_unstarted(self, pend: Pending, size: int) -> None:
        """``pend`` cannot fit even with nothing placed (:meth:`_spot`)."""
        for trial in pend.trials:
            self.fail(trial, self._grown(size), never_started=True)

    def _fail_out(self, p: Placement, size: int) -> None:
        """The switched-out ``p`` cannot come back even with nothing placed."""
        del self.out[p.trial.number]
        self._emit(DropState(p.trial.number))
        self.fail(p.trial, self._grown(size))

    def _grown(self, size: int) -> str:
        return (f"does not fit: the run's processes grew by {self.stats.growth:,} bytes "
                f"beyond their measured constants, and the budget left holds less than "
                f"its {size:,}")

    def _prune(self, w: Worker | None, p: Placement, why: str,
               regroup: bool = True) -> None:
        """Stop ``p`` (held by ``w``; None: switched out, its file dropped) as pruned,
        ``why`` in its record (:data:`BY_PRUNER`, :data:`NOT_PROMOTED`, :data:`FOR_ROOM`)."""
        if w is None:
            del self.out[p.trial.number]
            self._emit(DropState(p.trial.number))
        else:
            self._emit(Send(w.index, Stop(p.trial.number)))
            self._release(w, p, regroup=regroup)
        rounds = self.policy.last_step(p.trial)
        self._emit(Note(p.trial, {"rounds": rounds, "pruned": why,
                                  "pauses": p.pauses, "start": p.started, "end": self.now,
                                  **p.seconds, **self._work(p, p.rounds, p.validated),
                                  **self._switch_record(p)},
                        ending=True),
                   Tell(p.trial, state=TrialState.PRUNED))
        self.counts["pruned"] += 1
        self._emit(Measure())

    def _work(self, p: Placement, rounds: int, validated: int) -> dict[str, Any]:
        """The model arithmetic of ``p``'s ``rounds`` rounds trained and ``validated``
        validated (its own program's FLOPs for the training rows and the validation
        rows, :mod:`explore.utilisation`), for its record; added to the run's figures."""
        per_train, per_valid = p.candidate.round_flops
        train, valid = rounds * per_train, validated * per_valid
        self.stats.flops["train"] += train
        self.stats.flops["valid"] += valid
        return {"flops": train + valid} if train or valid else {}

    def _switch_record(self, p: Placement) -> dict[str, Any]:
        """What a trial's record says of its switches out of an arena (nothing if none):
        how many, the bytes written out, and when it was out (``out_spans``: [left,
        back] in seconds since the run began; back is the end for a trial that ended
        out)."""
        if not p.spans:
            return {}
        spans = [[round(t, 3) for t in (*span, self.now)[:2]] for span in p.spans]
        return {"switched_out": len(p.spans), "switch_bytes": p.moved, "out_spans": spans}
