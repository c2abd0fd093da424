"""A study remembers its space (issue 32, item 8): a run of another space under the same
study name is refused with exit 2, listing what changed, unless ``--space-changed`` says
it is meant (then the change is recorded in the study); a change no study can hold
(other choices, another log scale) is refused either way.  More trials, other workers
or memory are no change of the search."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from explore.space_change import CHANGES_ATTR
from tests.explore.cli_run import explore_run, explore_run_here
from tests.explore.test_explore_run import write


def trials(f: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{f.with_suffix('.db')}"
                             ).get_trials(deepcopy=False)


@pytest.mark.slow  # several runs of the CLI: CI's slow step
def test_a_changed_range_is_refused_unless_meant(tmp_path: Path) -> None:
    f = write(tmp_path, trials=2)
    first = explore_run(f)
    assert first.exit_code == 0, first.output
    write(tmp_path, trials=4, lr="{float: [1.0e-3, 1.0e-1], log: true}")
    refused = explore_run(f)
    assert refused.exit_code == 2, refused.output
    assert "training.lr: in [0.001, 0.03] (log) -> in [0.001, 0.1] (log)" in refused.output
    assert "--space-changed" in refused.output and "Traceback" not in refused.output
    assert len(trials(f)) == 2  # nothing written
    meant = explore_run(f, "--space-changed")
    assert meant.exit_code == 0, meant.output
    ts = trials(f)
    assert sum(t.state == TrialState.COMPLETE for t in ts) == 4
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{f.with_suffix('.db')}")
    (change,) = study.user_attrs[CHANGES_ATTR]
    assert change["changes"] == ["training.lr: in [0.001, 0.03] (log) -> in [0.001, 0.1] (log)"]
    again = explore_run(f, "--trials", "5", "--memory", "450MB")  # the budget: no change
    assert again.exit_code == 0, again.output


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_changed_choices_cannot_share_the_study(tmp_path: Path) -> None:
    f = write(tmp_path, trials=2)
    assert explore_run(f).exit_code == 0
    write(tmp_path, trials=4, width="{choice: [16, 64]}")
    for extra in ((), ("--space-changed",)):
        kept = sorted(p.name for p in tmp_path.iterdir())
        refused = explore_run_here(f, *extra)
        assert sorted(p.name for p in tmp_path.iterdir()) == kept  # no connection kept
        assert refused.exit_code == 2, refused.output
        assert "model.width: one of [16, 32] -> one of [16, 64]" in refused.output
        assert "another --study" in refused.output
    ts = trials(f)
    assert len(ts) == 2 and not [t for t in ts if t.state == TrialState.RUNNING]
    other = explore_run(f, "--study", "wider")
    assert other.exit_code == 0, other.output
