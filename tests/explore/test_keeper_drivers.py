"""The best models kept by several drivers of one study (``explore.keeper``): each
ranks against the list as stored, so the list holds the best of all of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from explore.keeper import MODELS_ATTR, ModelKeeper, default_artifacts


def _finished(study: optuna.Study, value: float) -> tuple[optuna.trial.FrozenTrial, int]:
    t = study.ask()
    study.tell(t, value)
    return study._storage.get_trial(t._trial_id), t.number


def test_two_drivers_keep_the_best_of_both(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    store = tmp_path / "s.artifacts"
    # both drivers start before either kept anything
    one = ModelKeeper(study, store, k=2, minimize=False)
    two = ModelKeeper(optuna.load_study(study_name="s", storage=storage), store, k=2,
                      minimize=False)
    for keeper, value in ((one, 0.5), (two, 0.7), (one, 0.6), (two, 0.55)):
        trial, number = _finished(study, value)
        staged = keeper.stage(number)  # where its worker would write the weights
        assert staged is not None
        np.savez(staged, w=np.zeros(3, np.float32))
        kept = keeper.keep(trial, staged)
        keeper.written(number)
        assert kept.state == TrialState.COMPLETE
    models = optuna.load_study(study_name="s", storage=storage).user_attrs[MODELS_ATTR]
    assert [(m["trial"], m["value"]) for m in models] == [(1, 0.7), (2, 0.6)]
    on_disk = {p.name for p in store.iterdir() if not p.name.startswith(".")}
    assert on_disk == {m["artifact"] for m in models}  # the pushed-out ones removed


def test_the_journal_keeps_its_models_next_to_its_file() -> None:
    assert default_artifacts("journal:////runs/q.log") == "/runs/q.artifacts"
    assert default_artifacts("postgresql+psycopg://me@db/x").endswith("explore-artifacts")
