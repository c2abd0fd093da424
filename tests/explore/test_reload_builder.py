"""A kept model from a Python builder is rebuilt with the builder given (a function or
its ``module:function``) or the one the study names; a study run with a builder that
cannot be imported again says so; and a study that keeps no model says why (its
trials failed, and how; or it was run with ``keep_models: 0``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

import explore
from explore.attrs import RECORD_ATTR, SPACE_ATTR
from explore.datasets import load_digits
from explore.families.builder import load_builder
from explore.trained import ModelError, none_kept
from tests.explore.cli_run import explore_here

NETS = '''
from engine import nn


def build(trial, data):
    width = trial.suggest_categorical("width", [8, 12])
    c, h, w = data.input_shape
    return Net(c, width, data.n_outputs, (c, h, w))


def other(trial, data):
    return nn.Linear(data.n_features, data.n_outputs)


class Net(nn.Module):
    def __init__(self, c, width, out, image):
        super().__init__()
        self.image = image
        self.conv = nn.Conv2d(c, width, 3, padding=1)
        self.head = nn.Linear(width * image[1] * image[2], out)

    def forward(self, x):
        h = nn.functional.relu(self.conv(x.reshape(-1, *self.image)))
        return self.head(h.flatten(1))
'''

SPACE = {"name": "nb", "dataset": "digits", "pruner": "none", "keep_models": 2,
         "budget": {"trials": 2, "rounds": 1, "memory": "400MB"},
         "training": {"lr": 0.02, "batch_size": 32}}


@pytest.fixture(scope="module")
def notebook_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    """A study run from Python with a builder defined where it cannot be imported again
    (a closure, as a notebook's cell is): its space records no ``module:function``."""
    folder = tmp_path_factory.mktemp("nb")
    (folder / "reload_nets.py").write_text(NETS)
    nets = load_builder("reload_nets:build", folder)

    def build(trial: Any, data: Any) -> Any:
        return nets(trial, data)

    storage = f"sqlite:///{folder / 'nb.db'}"
    study = explore.run(SPACE, builder=build, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    assert study.user_attrs[SPACE_ATTR]["model"]["builder"] is None
    yield storage, folder, build
    sys.modules.pop("reload_nets", None)


def test_a_notebook_builders_study_says_to_pass_the_builder(notebook_study: Any) -> None:
    storage, _, _ = notebook_study
    with pytest.raises(ModelError) as e:
        explore.load_model(storage, "nb")
    message = str(e.value)
    assert "study 'nb' was run with a model builder" in message
    assert "cannot be imported again" in message and "builder=build" in message
    assert "--builder module:function" in message
    assert "no variable" not in message  # not the family's model, tried in its place


def test_the_builder_given_rebuilds_the_kept_model(notebook_study: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    storage, folder, build = notebook_study
    model = explore.load_model(storage, "nb", builder=build)
    assert "conv.weight" in model.graph.variables
    test = load_digits().test
    assert (model.predict(test.x) == test.y).mean() > 0.3  # its trained weights, loaded
    monkeypatch.chdir(folder)  # a module:function is found from the current folder
    again = explore.load_model(storage, "nb", builder="reload_nets:build")
    np.testing.assert_array_equal(again.predict_proba(test.x[:20]),
                                  model.predict_proba(test.x[:20]))


def test_a_builder_of_another_model_is_refused_by_its_weights(notebook_study: Any,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    storage, folder, _ = notebook_study
    monkeypatch.chdir(folder)
    with pytest.raises(ModelError, match=r"weights kept for trial \d+ of study 'nb' do not "
                                         r"fit the model that builder reload_nets:other "
                                         r"builds \(no variable 'conv.weight'"):
        explore.load_model(storage, "nb", builder="reload_nets:other")
    with pytest.raises(ModelError, match="has no 'nope'"):
        explore.load_model(storage, "nb", builder="reload_nets:nope")


# -- why a study keeps no model -----------------------------------------------------------
def _study(space: dict[str, Any] | None, *trials: Any) -> optuna.Study:
    s = optuna.create_study(study_name="x")
    if space is not None:
        s.set_user_attr(SPACE_ATTR, space)
    for t in trials:
        s.add_trial(t)
    return s


def _failed(reason: str) -> Any:
    return create_trial(state=TrialState.FAIL, user_attrs={RECORD_ATTR: {"fail_reason": reason}})


TRACEBACK = ("the model builder raised:\n  File \"nets.py\", line 9, in build\n"
             "    raise ValueError('too wide')\nValueError: too wide")


def test_no_kept_model_because_every_trial_failed_names_the_reason() -> None:
    s = _study({"keep_models": 2}, *[_failed(TRACEBACK) for _ in range(4)])
    message = none_kept(s)
    assert message == ("study 'x' keeps no models: none of its 4 trials completed (4 failed: "
                       "the model builder raised: ... ValueError: too wide)")
    assert "keep_models > 0" not in message


def test_no_kept_model_with_mixed_endings_names_the_most_common_failure() -> None:
    s = _study({"keep_models": 2}, _failed("does not fit: 9 bytes"), _failed(TRACEBACK),
               _failed(TRACEBACK), create_trial(state=TrialState.RUNNING))
    assert none_kept(s) == ("study 'x' keeps no models: none of its 4 trials completed "
                            "(1 running; 3 failed, 2 of them: the model builder raised: "
                            "... ValueError: too wide)")


def test_keep_models_zero_is_said_only_when_the_space_says_it() -> None:
    ok = create_trial(state=TrialState.COMPLETE, value=0.9)
    assert "run with keep_models: 0" in none_kept(_study({"keep_models": 0}, ok))
    message = none_kept(_study({"keep_models": 3}, ok))
    assert message == "study 'x' keeps no models: its 1 completed trial kept none"
    unkept = create_trial(state=TrialState.COMPLETE, value=0.9, user_attrs={
        RECORD_ATTR: {"model_error": "its model could not be kept: disk full"}})
    assert none_kept(_study({"keep_models": 3}, unkept)).endswith(
        "keeps no models: its model could not be kept: disk full")
    assert "it has no trials" in none_kept(_study({"keep_models": 3}))


def test_export_model_of_a_study_whose_trials_all_failed_says_why(tmp_path: Path) -> None:
    (tmp_path / "raising_nets.py").write_text(
        "def build(trial, data):\n    trial.suggest_int('n', 1, 2)\n"
        "    raise ValueError(f'no model for {data.n_classes} classes')\n")
    f = tmp_path / "r.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 2, rounds: 1, memory: 400MB}\n"
                 "model: {builder: 'raising_nets:build'}\nkeep_models: 2\n")
    run = subprocess.run([sys.executable, "-m", "explore.cli", "run", str(f), "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr  # every trial failed
    r = explore_here("export-model", f, "--output", tmp_path / "m.onnx")
    text = " ".join(r.stderr.split())  # rich wraps at the terminal's width
    assert r.returncode == 2, text
    assert "none of its 2 trials completed (2 failed: the model builder raised:" in text, text
    assert "ValueError: no model for 10 classes" in text
    assert "keep_models > 0" not in text
    assert not (tmp_path / "m.onnx").exists()
