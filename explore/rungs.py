"""Pausing at pruning rungs: a trial that is not promoted waits instead of dying.

Optuna's successive halving (and Hyperband, a set of successive-halving brackets) is
asynchronous: at each rung a trial goes on only if its value is in the top ``1/eta``
of the values reported at that rung *so far*, and is pruned otherwise.  Early in a
search that set is small and arbitrary, so a good trial that happens to reach a rung
right after a better one is lost for good ("Optuna does not support suspending or
resuming ongoing trials", says its source).  The scheduler can: its workers hold a
trial's whole state in their arenas, so a trial that the pruner would stop at a rung
is *paused* there (its memory kept, no compute spent) and resumed as soon as later
results at the same rung promote it, which is the synchronous successive halving of
the original algorithm.  A paused trial is pruned at the end of the run; when its
memory is needed it is switched out of its arena into a file (:mod:`explore.scheduler.core`,
lowest :func:`standing` first) and comes back into any arena with room once promoted.

The promotion rule is Optuna's (:func:`promotable`), applied to the values recorded
under the rung's system attribute, within the trial's bracket for Hyperband.

>>> import optuna
>>> from explore.optuna_adapter import frozen_trial as frozen
>>> optuna.logging.set_verbosity(optuna.logging.WARNING)
>>> study = optuna.create_study(direction="maximize",
...                             pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1))
>>> first, second = study.ask(), study.ask()
>>> first.report(0.9, 1); first.should_prune()
False
>>> failed = rungs_done(frozen(study, second)); second.report(0.5, 1); second.should_prune()
True
>>> failed_rung(frozen(study, second), failed), promotable(study, frozen(study, second), 0)
(0, False)
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.pruners import HyperbandPruner, SuccessiveHalvingPruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from explore.optuna_adapter import bracket, reduction_factor


def pauses(pruner: optuna.pruners.BasePruner) -> bool:
    """Whether ``pruner`` decides at rungs, so that a trial it stops can be paused."""
    return isinstance(pruner, SuccessiveHalvingPruner | HyperbandPruner)


def rungs_done(trial: FrozenTrial) -> int:
    """How many rungs the trial has been judged at."""
    n = 0
    while _key(n) in trial.system_attrs:
        n += 1
    return n


def failed_rung(trial: FrozenTrial, before: int) -> int | None:
    """The rung at which a just-pruned trial failed promotion (``before`` is
    :func:`rungs_done` from before its ``should_prune``), or None when it was pruned
    for another reason (a NaN value), which no later result can undo."""
    after = rungs_done(trial)
    if after == before or _is_nan(trial.system_attrs[_key(after - 1)]):
        return None
    return after - 1


def promotable(study: optuna.Study, trial: FrozenTrial, rung: int) -> bool:
    """Whether ``trial``'s value at ``rung`` is now in the top ``1/eta`` of the values
    reported there (at least the best one), by Optuna's own rule."""
    value, competing, eta, maximize = _competing(study, trial, rung)
    top = max(len(competing) // eta, 1)
    if maximize:
        return bool(value >= competing[-top])
    return bool(value <= competing[top - 1])


def standing(study: optuna.Study, trial: FrozenTrial, rung: int) -> float:
    """How far down ``trial``'s value at ``rung`` ranks among the values reported there
    (within its bracket for Hyperband): the share of them that are better, 0 for the
    best.  A trial paused there is promoted once it climbs into the top ``1/eta``, so
    the one standing lowest is the least likely to be promoted soon: the scheduler
    switches it out of its arena first when room is needed."""
    value, competing, _, maximize = _competing(study, trial, rung)
    better = sum(v > value if maximize else v < value for v in competing)
    return better / len(competing)


def _competing(study: optuna.Study, trial: FrozenTrial, rung: int
               ) -> tuple[float, list[float], int, bool]:
    """The trial's value at ``rung``, every value reported there (its own included,
    sorted), the pruner's reduction factor and whether larger values are better."""
    pruner: Any = study.pruner
    trials = study.get_trials(deepcopy=False)
    if isinstance(pruner, HyperbandPruner):
        # Hyperband's brackets are successive-halving studies over a hash of trials
        trials, pruner = bracket(pruner, study, trial)
    key = _key(rung)
    value = trial.system_attrs[key]
    competing = sorted([value, *(t.system_attrs[key] for t in trials
                                 if key in t.system_attrs and t.number != trial.number)])
    return value, competing, reduction_factor(pruner), \
        study.direction == StudyDirection.MAXIMIZE


def _key(rung: int) -> str:
    return f"completed_rung_{rung}"  # where Optuna's successive halving keeps the values


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and v != v
