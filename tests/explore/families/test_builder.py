"""Models from the user's Python (``model: {builder: "module:function"}``): the builder
asks Optuna's trial for its own parameters; each trial's model is compiled and packed
like any candidate; the user's errors fail their own trials with the user's traceback;
a kept model is rebuilt by replaying what the builder chose."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest

import explore
from explore.families import Shape, get
from explore.study import PARAMS_ATTR, RECORD_ATTR
from tests.explore.cli_run import explore_here, explore_run

ROOT = Path(__file__).resolve().parents[2]

MODULE = '''
from explore.families import Shape, get


def build(trial):
    width = trial.suggest_int("width", 8, 64, log=True)
    act = trial.suggest_categorical("act", ["relu", "tanh"])
    if width > 40:
        raise ValueError(f"too wide for this test: {width}")
    return get("mlp").build({"depth": 1, "widths": [width], "activations": [act],
                        "dropouts": [0.0], "init": "he_uniform"}, Shape(64, 10, pixel_scale=1 / 16))
'''


def space(tmp: Path, builder: str = "my_models:build", trials: int = 8) -> Path:
    (tmp / "my_models.py").write_text(MODULE)
    f = tmp / "b.yaml"
    f.write_text(f"dataset: digits\nbudget: {{trials: {trials}, rounds: 2, memory: 400MB}}\n"
                 "sampler: {name: random, seed: 0}\npruner: none\n"
                 f"model: {{builder: \"{builder}\"}}\ntraining: {{lr: 0.02, batch_size: 32}}\n"
                 "keep_models: 2\n")
    return f


def test_a_builder_asks_its_own_parameters_and_its_errors_fail_only_its_trials(
        tmp_path: Path) -> None:
    f = space(tmp_path)
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="b", storage=f"sqlite:///{tmp_path / 'b.db'}")
    states = {t.number: t.state.name for t in study.trials}
    assert len(states) == 8
    for t in study.trials:
        assert {"width", "act"} <= set(t.params)  # define-by-run: Optuna saw them
        record = t.user_attrs[RECORD_ATTR]
        if t.params["width"] > 40:
            assert t.state.name == "FAIL"
            reason = record["fail_reason"]
            assert "my_models.py\", line 9, in build" in reason, reason
            assert "too wide for this test" in reason
        else:
            assert t.state.name == "COMPLETE", record
            assert record[PARAMS_ATTR]["builder_params"] == {
                "width": t.params["width"], "act": t.params["act"]}
    assert "COMPLETE" in states.values() and "FAIL" in states.values()
    # a kept model is rebuilt by replaying what the builder chose
    model = explore.load_model(tmp_path / "b.db", "b")
    assert model.params["builder_params"]["width"] <= 40
    ex = explore_here("export-model", f, "--output", tmp_path / "m.onnx")
    assert ex.returncode == 0, ex.stderr
    # show lists the builder's own choices with the others, not the unused family keys
    shown = explore_here("show", f)
    assert shown.returncode == 0 and "width=" in shown.stdout and "act=" in shown.stdout
    assert "depth=" not in shown.stdout and "builder_params" not in shown.stdout


def test_a_builder_that_cannot_be_imported_names_its_line(tmp_path: Path) -> None:
    f = space(tmp_path, builder="my_models:nope")
    r = explore_run(f)
    text = r.output.replace("\n", "")  # rich wraps long paths at the terminal's width
    assert r.exit_code == 2 and "b.yaml:5" in text and "model.builder" in text
    assert "has no 'nope'" in text
    assert not (tmp_path / "b.db").exists()
    f = space(tmp_path, builder="no_such_module:build")
    r = explore_run(f)
    assert r.exit_code == 2 and "cannot import 'no_such_module'" in r.output.replace("\n", "")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    r = explore_run(space(tmp_path, builder="exits:build"))  # not explore's exit status 3
    text = r.output.replace("\n", "")
    assert r.exit_code == 2 and "cannot import 'exits'" in text and "sys.exit(3)" in text
    assert not (tmp_path / "b.db").exists()


@pytest.mark.parametrize("given", [{}, {"width": 32, "act": "tanh"}])
def test_explore_size_sizes_a_builders_model(tmp_path: Path, given: dict) -> None:
    """The smallest model (every range at its low end), or the one --params names."""
    args = [x for k, v in given.items() for x in ("--params", f"{k}={v}")]
    r = explore_here("size", space(tmp_path), *args, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = get("mlp").build({"depth": 1, "widths": [given.get("width", 8)],
                        "activations": [given.get("act", "relu")], "dropouts": [0.0],
                        "init": "he_uniform"}, Shape(64, 10, pixel_scale=1 / 16))
    from engine import compile_graph
    from explore.optimizers import build_optimizer
    from explore.sampling import fixed
    from explore.space import load_space

    p = fixed(load_space(space(tmp_path)))
    prog = compile_graph(want, batch_size=got["compiled_batch"], optimizer=build_optimizer(p))
    assert got["total_bytes"] == prog.total_bytes


def wide_or_narrow(trial: optuna.Trial) -> object:
    """A builder as a notebook's function (importable here: the study records it)."""
    width = trial.suggest_categorical("width", [8, 24])
    return get("mlp").build({"depth": 1, "widths": [width], "activations": ["relu"],
                        "dropouts": [0.0], "init": "he_uniform"}, Shape(64, 10, pixel_scale=1 / 16))


def test_explore_run_takes_a_builder_function(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'f.db'}"
    study = explore.run({"name": "f", "dataset": "digits",
                         "budget": {"trials": 3, "rounds": 1, "memory": "400MB"},
                         "pruner": "none", "training": {"lr": 0.02, "batch_size": 32}},
                        builder=wide_or_narrow, storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert study.user_attrs["space"]["model"]["builder"] == \
        "tests.explore.families.test_builder:wide_or_narrow"
    model = explore.load_model(storage, "f")  # the recorded builder, imported again
    assert model.params["builder_params"]["width"] in (8, 24)


def test_a_calcgraph_that_breaks_the_conventions_fails_its_trial(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "from engine import CalcGraph\n\ndef build(trial):\n"
        "    trial.suggest_int('n', 1, 2)\n    return CalcGraph()\n")
    f = tmp_path / "bad.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 2, rounds: 1, memory: 400MB}\n"
                 "model: {builder: 'bad:build'}\n")
    r = explore_run(f)
    assert r.exit_code == 1, r.output  # every trial failed
    study = optuna.load_study(study_name="bad", storage=f"sqlite:///{tmp_path / 'bad.db'}")
    for t in study.trials:
        assert t.state.name == "FAIL"
        assert "does not follow the conventions" in t.user_attrs[RECORD_ATTR]["fail_reason"]


@pytest.fixture(autouse=True)
def _clean_modules() -> object:
    """Each test writes its own my_models.py: forget the one imported before."""
    yield
    for name in ("my_models", "bad", "nets"):
        sys.modules.pop(name, None)


NN_MODULE = '''
from engine import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Linear(width * 16, 10)

    def forward(self, x):
        h = nn.functional.relu(self.norm(self.conv(x.reshape(-1, 1, 8, 8))))
        return self.head(nn.functional.max_pool2d(h, 2).flatten(1))


def build(trial):
    return Net(trial.suggest_categorical("width", [4, 8]))


def broken(trial):
    trial.suggest_int("n", 1, 2)
    return nn.Linear(3, 10)   # the rows have 64 values: a shape mismatch when traced
'''


def test_an_engine_nn_module_from_a_builder_is_traced_trained_and_exported(
        tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    import numpy as np

    from explore.datasets import load_digits

    (tmp_path / "nets.py").write_text(NN_MODULE)
    f = tmp_path / "n.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 3, rounds: 2, memory: 500MB}\n"
                 "sampler: {name: random, seed: 1}\npruner: none\n"
                 "model: {builder: 'nets:build'}\ntraining: {lr: 0.01, batch_size: 32}\n")
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="n", storage=f"sqlite:///{tmp_path / 'n.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    model = explore.load_model(tmp_path / "n.db", "n")
    assert "conv.weight" in model.graph.variables and "norm.running_var" in model.graph.variables
    test = load_digits().test
    sess = ort.InferenceSession(model.to_onnx().SerializeToString())
    probs, labels = sess.run(["probabilities", "label"], {"x": model.features(test.x)})
    np.testing.assert_allclose(probs, model.predict_proba(test.x), atol=1e-5)
    assert (labels == test.y).mean() > 0.5


def test_a_tracing_error_fails_the_trial_naming_the_users_line(tmp_path: Path) -> None:
    (tmp_path / "nets.py").write_text(NN_MODULE)
    f = tmp_path / "t.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 500MB}\n"
                 "model: {builder: 'nets:broken'}\n")
    r = explore_run(f)
    assert r.exit_code == 1, r.output  # every trial failed
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    (t,) = study.trials
    reason = t.user_attrs[RECORD_ATTR]["fail_reason"]
    assert t.state.name == "FAIL" and "TraceError" in reason, reason
    assert "inner dimensions differ" in reason and "Linear" in reason, reason
