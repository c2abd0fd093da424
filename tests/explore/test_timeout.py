"""``--timeout`` / ``budget.timeout`` / ``explore.run(timeout=)``: after that many seconds
from the run's start no new trial starts; the trials in hand finish, the run ends as
it would at its trials (exit status 0) and its summary says it stopped at the timeout;
running it again goes on with the study.  The core's part is tested without processes
in ``tests/explore/scheduler/test_timeout_core.py``."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from explore.attrs import RUNS_ATTR
from explore.cli import main
from explore.live import counted
from explore.runner import RunRefused, prepare
from tests.explore.cli_run import explore_run

SPACE = {"name": "t", "dataset": "digits", "keep_models": 0, "pruner": "none",
         "sampler": {"name": "random", "seed": 0},
         "budget": {"trials": 400, "rounds": 2, "memory": "400MB", "workers": 1},
         "model": {"depth": 1, "width": {"int": [8, 32]}},
         "training": {"lr": 0.02, "batch_size": 32}}


def test_the_option_overrides_the_budget_key_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    keyed = {**SPACE, "budget": {**SPACE["budget"], "timeout": 7}}
    assert prepare(SPACE, storage=storage).space.budget.timeout is None
    assert prepare(keyed, storage=storage).space.budget.timeout == 7
    assert prepare(keyed, storage=storage, timeout=2.5).space.budget.timeout == 2.5
    with pytest.raises(RunRefused, match=r"--timeout: .*greater than 0"):
        prepare(SPACE, storage=storage, timeout=0)
    space = tmp_path / "t.yaml"
    space.write_text("dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 400MB}\n")
    result = CliRunner().invoke(main, ["run", str(space), "--timeout", "0", "--quiet"])
    assert result.exit_code == 2 and "--timeout" in result.output, result.output
    assert not (tmp_path / "t.db").exists()  # refused before anything was written


def test_a_run_stops_at_its_timeout_with_every_trial_it_began_ended(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    # the space's key; a trial takes a fraction of a second, 400 of them far longer (the
    # seconds count from the run's start: its workers' start too)
    f.write_text(json.dumps({**SPACE, "budget": {**SPACE["budget"], "timeout": 3}}))
    r = explore_run(f)
    said = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert r.exit_code == 0, r.output
    assert "stopped at the timeout (3 s, budget.timeout)" in said, said
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert len(study.trials) < 400
    # what was begun ran to its end; nothing is left running or queued for the next run
    # (which goes on as any run of a study that has fewer than its trials)
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    assert all(counted(t) for t in study.trials)
    run = study.user_attrs[RUNS_ATTR][-1]
    assert run["timed_out"] is True
