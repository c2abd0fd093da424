"""Every use of Optuna's private attributes, in one place, each with a test that fails
if Optuna changes what it is relied on for (``tests/explore/test_optuna_adapter.py``).

Optuna has no public way to reach a study's storage, a trial's storage id or
Hyperband's brackets; explore needs them to read a trial as stored without copying
every trial (:func:`frozen_trial`), to fill in a trial enqueued in the storage
(:func:`storage_of`, :func:`trial_id`) and to re-apply the promotion rule of a rung
pruner to a paused trial (:func:`bracket`, :func:`reduction_factor`).

>>> import optuna
>>> optuna.logging.set_verbosity(optuna.logging.WARNING)
>>> study = optuna.create_study()
>>> t = study.ask(); t.report(0.5, 1)
>>> frozen_trial(study, t).intermediate_values
{1: 0.5}
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.pruners import HyperbandPruner, SuccessiveHalvingPruner
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes (``Study._storage``)."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """A study's id in its storage (``_study_id``)."""
    return int(study._study_id)


def trial_id(trial: Trial | FrozenTrial) -> int:
    """A trial's id in its storage, unique across studies (``_trial_id``; a trial's
    ``number`` counts within its study)."""
    return trial._trial_id


def frozen_trial(study: optuna.Study, trial: Trial) -> FrozenTrial:
    """``trial`` as the storage holds it now, system attributes too, without the copy
    of every trial that ``study.get_trials`` makes."""
    return storage_of(study).get_trial(trial_id(trial))


def bracket(pruner: HyperbandPruner, study: optuna.Study, trial: FrozenTrial
            ) -> tuple[list[FrozenTrial], SuccessiveHalvingPruner]:
    """The trials of ``trial``'s Hyperband bracket and the bracket's successive-halving
    pruner (``_get_bracket_id``, ``_create_bracket_study``, ``_pruners``)."""
    bracket_id = pruner._get_bracket_id(study, trial)
    trials = pruner._create_bracket_study(study, bracket_id).get_trials(deepcopy=False)
    return list(trials), pruner._pruners[bracket_id]


def reduction_factor(pruner: SuccessiveHalvingPruner) -> int:
    """``eta``: a rung promotes the top ``1/eta`` (``_reduction_factor``)."""
    return int(pruner._reduction_factor)


def grid_points(sampler: optuna.samplers.BaseSampler) -> list[dict[str, Any]] | None:
    """Every point of a grid sampler's grid, as parameters (``_all_grids`` and
    ``_param_names``); None for another sampler."""
    if not isinstance(sampler, optuna.samplers.GridSampler):
        return None
    names = list(sampler._param_names)
    return [dict(zip(names, g, strict=True)) for g in sampler._all_grids]
