"""What explore relies on in Optuna's private attributes (explore/optuna_adapter.py),
checked against the installed Optuna: each test fails if a new version changes it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.pruners import HyperbandPruner, SuccessiveHalvingPruner
from optuna.trial import TrialState

from explore.optuna_adapter import bracket, frozen_trial, reduction_factor, storage_of, trial_id
from explore.rungs import failed_rung, promotable, rungs_done

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["memory", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return optuna.storages.InMemoryStorage()
    return f"sqlite:///{tmp_path / 'a.db'}"


def test_storage_of_is_the_storage_the_study_writes(storage: Any) -> None:
    study = optuna.create_study(storage=storage, study_name="s")
    assert isinstance(storage_of(study), optuna.storages.BaseStorage)
    t = study.ask()
    storage_of(study).set_trial_user_attr(trial_id(t), "why", "because")  # a RUNNING trial
    assert study.get_trials()[0].user_attrs == {"why": "because"}
    assert optuna.load_study(study_name="s", storage=storage_of(study)).trials[0].number == 0


def test_trial_ids_are_the_storage_ids_of_trials_and_frozen_trials(storage: Any
                                                                   ) -> None:
    a = optuna.create_study(storage=storage, study_name="a")
    b = optuna.create_study(storage=storage, study_name="b")
    ta, tb = a.ask(), b.ask()
    assert trial_id(ta) != trial_id(tb)  # unique across the studies of one storage
    assert trial_id(a.get_trials()[0]) == trial_id(ta)
    stored = storage_of(a).get_trial(trial_id(ta))
    assert stored.number == ta.number == 0


def test_frozen_trial_sees_reports_and_system_attributes() -> None:
    study = optuna.create_study(pruner=SuccessiveHalvingPruner(min_resource=1))
    t = study.ask()
    t.report(0.25, 1)
    assert not t.should_prune()
    ft = frozen_trial(study, t)
    assert ft.intermediate_values == {1: 0.25}
    # explore.rungs reads the values successive halving keeps per rung
    assert ft.system_attrs.get("completed_rung_0") == 0.25 and rungs_done(ft) == 1


def test_reduction_factor() -> None:
    assert reduction_factor(SuccessiveHalvingPruner(reduction_factor=3)) == 3
    hb = HyperbandPruner(min_resource=1, max_resource=9, reduction_factor=2)
    study = optuna.create_study(pruner=hb)
    t = study.ask()
    t.report(1.0, 1)
    t.should_prune()  # Hyperband makes its brackets on first use
    trials, sh = bracket(hb, study, frozen_trial(study, t))
    assert isinstance(sh, SuccessiveHalvingPruner) and reduction_factor(sh) == 2
    assert [x.number for x in trials] == [0]


def test_brackets_hold_the_trials_hyperband_assigns_them() -> None:
    hb = HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)
    study = optuna.create_study(pruner=hb)
    for _ in range(12):
        t = study.ask()
        t.report(0.0, 1)
        t.should_prune()
        study.tell(t, 0.0)
    groups = {}
    for ft in study.trials:
        trials, sh = bracket(hb, study, ft)
        groups.setdefault(id(sh), set()).update(x.number for x in trials)
        assert ft.number in {x.number for x in trials}
    seen = [n for g in groups.values() for n in g]
    assert len(groups) > 1 and sorted(seen) == list(range(12))  # a partition


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
@pytest.mark.parametrize("kind", ["successive_halving", "hyperband"])
def test_promotable_agrees_with_optunas_own_decisions(kind: str, direction: str) -> None:
    """At the moment a trial is judged at a rung, explore's rule (applied to paused
    trials later) must say what Optuna said: promoted exactly when not pruned."""
    pruner = SuccessiveHalvingPruner(min_resource=1, reduction_factor=2) \
        if kind == "successive_halving" else \
        HyperbandPruner(min_resource=1, max_resource=8, reduction_factor=2)
    study = optuna.create_study(direction=direction, pruner=pruner)
    rnd = random.Random(0)
    judged = pruned = 0
    for _ in range(40):
        t = study.ask()
        state = TrialState.COMPLETE
        for step in range(1, 9):
            before = rungs_done(frozen_trial(study, t))
            t.report(rnd.random(), step)
            stop = t.should_prune()
            ft = frozen_trial(study, t)
            if rungs_done(ft) > before:
                judged += 1
                assert promotable(study, ft, rungs_done(ft) - 1) == (not stop)
            if stop:
                assert failed_rung(ft, before) == rungs_done(ft) - 1
                state, pruned = TrialState.PRUNED, pruned + 1
                break
        study.tell(t, None if state == TrialState.PRUNED else rnd.random(), state=state)
    assert judged > 40 and pruned > 5
