"""What the pruner says of a trial's report, for the decision core (:mod:`.core`).

The core asks a :class:`Policy` whether a trial goes on, is pruned or pauses at a rung,
whether a paused trial is promoted and how it stands at its rung (which paused trial
leaves its arena first); :class:`OptunaPolicy` answers from the run's
working copy of the study (its pruner, and for a rung pruner the rungs
:mod:`explore.rungs` reads).  A simulation gives the core a policy of its own.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import optuna

from explore import metrics
from explore.optuna_adapter import frozen_trial as frozen
from explore.rungs import failed_rung, pauses, promotable, rungs_done, standing
from explore.space import Space

PRUNE: Literal["prune"] = "prune"
# What a report leads to: None (go on), PRUNE, or the rung the trial pauses at.
Verdict = int | Literal["prune"] | None


class Policy(Protocol):
    """The pruner's word on trials, as the core needs it."""

    # a rung pruner's trials wait for its word after each report, so that one it
    # would stop can be paused at the rung instead
    gated: bool

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Verdict: ...

    def promotable(self, trial: Any, rung: int) -> bool: ...

    # how far down a trial paused at ``rung`` ranks there (0: the best): the one
    # standing lowest leaves its arena first when room is needed
    def standing(self, trial: Any, rung: int) -> float: ...

    def last_step(self, trial: Any) -> int | None: ...

    def values(self, measured: dict[str, float], heap: int) -> list[float]: ...

    def best(self, a: float | None, b: float) -> float: ...


class OptunaPolicy:
    """The study's pruner and objectives (``study`` is the run's working copy)."""

    def __init__(self, study: optuna.Study, space: Space) -> None:
        self.study, self.space = study, space
        single = len(study.directions) == 1
        self.gated = bool(space.pruner.pause and single and pauses(study.pruner))
        # only a single objective measured every round is reported to the pruner
        self.reports = single and metrics.get(space.objectives[0].metric).per_round
        self.maximize = single and study.direction.name == "MAXIMIZE"

    def report(self, trial: Any, round: int, measured: dict[str, float],
               heap: int) -> Verdict:
        if not self.reports:
            return None
        before = rungs_done(frozen(self.study, trial)) if self.gated else 0
        trial.report(metrics.get(self.space.objectives[0].metric).value(measured, heap),
                     round)
        if not trial.should_prune():
            return None
        rung = failed_rung(frozen(self.study, trial), before) if self.gated else None
        return PRUNE if rung is None else rung

    def promotable(self, trial: Any, rung: int) -> bool:
        return promotable(self.study, frozen(self.study, trial), rung)

    def standing(self, trial: Any, rung: int) -> float:
        return standing(self.study, frozen(self.study, trial), rung)

    def last_step(self, trial: Any) -> int | None:
        step: int | None = frozen(self.study, trial).last_step
        return step

    def values(self, measured: dict[str, float], heap: int) -> list[float]:
        return [metrics.get(o.metric).value(measured, heap) for o in self.space.objectives]

    def best(self, a: float | None, b: float) -> float:
        if a is None:
            return b
        return max(a, b) if self.maximize else min(a, b)
