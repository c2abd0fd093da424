"""A user's own table, end to end: a search from a CSV file (the CLI) or a DataFrame
(``explore.run``), the task's metrics, the best models kept, evaluated on the test
split and exported as ONNX that takes raw rows and predicts what the engine does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest

import explore
from explore.keeper import MODELS_ATTR
from explore.study import RECORD_ATTR
from tests.explore.cli_run import explore_here, explore_run

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")


def churn(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """A small table: two numeric columns, a text category, and a text label that the
    numbers and the category decide."""
    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 80, n).round()
    spend = rng.normal(50, 15, n)
    plan = rng.choice(["basic", "plus", "pro"], n)
    score = (age - 50) / 10 + (spend - 50) / 15 + np.where(plan == "pro", 1.5, 0.0)
    return pd.DataFrame({"age": age, "spend": spend, "plan": plan,
                         "churned": np.where(score + rng.normal(0, 0.3, n) > 0, "yes", "no")})


def onnx_inputs(df: pd.DataFrame, numeric: list[str], categorical: list[str]
                ) -> dict[str, np.ndarray]:
    feeds = {"x": df[numeric].to_numpy(np.float32)}
    for c in categorical:
        ints = pd.api.types.is_integer_dtype(df[c])
        feeds[c] = df[[c]].to_numpy().astype(np.int64 if ints else object)
    return feeds


@pytest.mark.slow  # a whole run and its exports through the CLI: CI's slow step
def test_a_csv_classification_from_the_cli(tmp_path: Path) -> None:
    """CSV in, text labels out: the run names where its results went and what to do
    next; evaluate reports the task's metrics on the test split; the exported model,
    fed raw columns, gives the engine's labels and probabilities."""
    churn().to_csv(tmp_path / "churn.csv", index=False)
    space = tmp_path / "churn.yaml"
    space.write_text(
        "dataset: {path: churn.csv, target: churned, categorical: [plan], valid: 0.25,\n"
        "          test: 0.25, scale: standard}\n"
        "objectives: [{metric: f1}]\n"
        "budget: {trials: 4, rounds: 8, memory: 400MB, workers: 2}\n"
        "sampler: {name: random, seed: 0}\npruner: none\n"
        "model: {depth: {int: [0, 1]}, width: 16}\n"
        "training: {lr: 0.02, batch_size: 16}\n"
        "keep_models: 2\n")
    r = explore_run(space)
    assert r.exit_code == 0, r.output
    assert "explore show" in r.output and "export-model" in r.output and "churn.db" in r.output
    study = optuna.load_study(study_name="churn", storage=f"sqlite:///{tmp_path / 'churn.db'}")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 4
    for t in done:
        m = t.user_attrs[RECORD_ATTR]["metrics"]
        assert set(m) >= {"accuracy", "loss", "f1", "roc_auc"}
        assert t.value == m["f1"]
    kept = study.user_attrs[MODELS_ATTR]
    assert len(kept) == 2
    by_number = {t.number: t for t in study.trials}  # as stored, not as asked
    for k in kept:
        assert by_number[k["trial"]].user_attrs[RECORD_ATTR]["model"] == k["artifact"]
    best = sorted((t.value for t in done), reverse=True)[:2]
    assert [k["value"] for k in kept] == best
    # only the kept models stay in the store
    stored = [f for f in (tmp_path / "churn.artifacts").iterdir() if f.is_file()]
    assert sorted(f.name for f in stored) == sorted(k["artifact"] for k in kept)

    ev = explore_here("evaluate", space, "--json")
    assert ev.returncode == 0, ev.stderr
    got = json.loads(ev.stdout)
    assert set(got["metrics"]) == {"accuracy", "loss", "f1", "roc_auc"}
    assert got["rows"] == 60 and 0.0 <= got["metrics"]["accuracy"] <= 1.0

    dropped = next(t.number for t in done if t.user_attrs[RECORD_ATTR].get("model") is None)
    no = explore_here("export-model", space, "--trial", str(dropped), "--output",
                      tmp_path / "no.onnx")
    assert no.returncode == 2 and f"trial {dropped} of study 'churn' has no kept model" \
        in no.stderr, no.stderr
    assert not (tmp_path / "no.onnx").exists()
    out = tmp_path / "model.onnx"
    ex = explore_here("export-model", space, "--output", out)
    assert ex.returncode == 0, ex.stderr
    model = explore.load_model(tmp_path / "churn.db", "churn")
    rows = churn(50, seed=7)
    sess = ort.InferenceSession(str(out))
    probs, labels = sess.run(["probabilities", "label"],
                             onnx_inputs(rows, ["age", "spend"], ["plan"]))
    np.testing.assert_allclose(probs, model.predict_proba(rows), rtol=1e-4, atol=1e-6)
    assert list(labels) == list(model.predict(rows))
    assert set(labels) <= {"yes", "no"}


def test_a_dataframe_regression_from_python(tmp_path: Path) -> None:
    """explore.run with a DataFrame: a regression, its metrics in the target's units,
    the best model's predictions in onnxruntime equal to the engine's on raw rows."""
    rng = np.random.default_rng(3)
    n = 300
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.uniform(0, 10, n),
                       "kind": rng.integers(0, 3, n)})
    df["y"] = 100 + 20 * df["a"] - 3 * df["b"] + 10 * (df["kind"] == 2) + rng.normal(0, 1, n)
    space = {"name": "reg", "dataset": {"categorical": ["kind"], "valid": 0.2, "test": 0.2},
             "objectives": [{"metric": "rmse"}],
             "budget": {"trials": 3, "rounds": 15, "memory": "400MB", "workers": 1},
             "sampler": {"name": "random", "seed": 1}, "pruner": "none",
             "model": {"depth": 1, "width": 16},
             "training": {"loss": {"choice": ["mse", "huber"]}, "lr": 0.02,
                          "batch_size": 16},
             "keep_models": 1}
    storage = f"sqlite:///{tmp_path / 'reg.db'}"
    study = explore.run(space, data=df, target="y", storage=storage)
    assert study.study_name == "reg" and len(study.trials) == 3
    for t in study.trials:
        assert t.state.name == "COMPLETE", t.user_attrs
        m = t.user_attrs[RECORD_ATTR]["metrics"]
        assert set(m) >= {"loss", "rmse", "mae", "r2"} and "accuracy" not in m
        assert t.value == m["rmse"]
    assert min(t.value for t in study.trials) < 10  # the target's spread is ~25
    model = explore.load_model(storage, "reg")
    rows = df.iloc[:40]
    pred = model.predict(rows)
    assert np.abs(pred - rows["y"].to_numpy()).mean() < 10
    proto = model.to_onnx()
    sess = ort.InferenceSession(proto.SerializeToString())
    (got,) = sess.run(["prediction"], onnx_inputs(rows, ["a", "b"], ["kind"]))
    np.testing.assert_allclose(got, pred, rtol=1e-4, atol=1e-3)


def test_an_objective_that_does_not_suit_the_task_is_refused_before_any_study(
        tmp_path: Path) -> None:
    pd.DataFrame({"x": np.arange(40.0), "y": np.arange(40.0) * 2}).to_csv(
        tmp_path / "t.csv", index=False)
    space = tmp_path / "t.yaml"
    space.write_text("dataset: {path: t.csv, target: y, task: regression}\n"
                     "objectives: [{metric: accuracy}]\n"
                     "budget: {trials: 1, rounds: 1, memory: 400MB}\n")
    r = explore_run(space)
    assert r.exit_code == 2, r.output
    assert "'accuracy' does not apply" in r.output and "rmse" in r.output
    assert "t.yaml:2: objectives[0].metric: " in r.output, r.output  # its file and line
    assert not (tmp_path / "t.db").exists()


def test_export_model_of_a_study_without_kept_models_says_so(tmp_path: Path) -> None:
    storage = tmp_path / "none.db"
    optuna.create_study(study_name="none", storage=f"sqlite:///{storage}")
    r = explore_here("export-model", "--storage", f"sqlite:///{storage}", "--study", "none",
                     "--output", tmp_path / "m.onnx")
    assert r.returncode == 2 and "keeps no models" in r.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_a_built_in_image_set_model_exports_with_its_pixels_as_input(tmp_path: Path) -> None:
    """digits keeps its compact uint8 pixels: the exported CNN (batch norm folded to its
    running statistics) takes them and agrees with the engine on the test split."""
    from explore.datasets import load_digits

    space = tmp_path / "d.yaml"
    space.write_text("dataset: digits\nbudget: {trials: 1, rounds: 2, memory: 400MB}\n"
                     "pruner: none\nmodel: {family: cnn, blocks: 1, channels: 8, "
                     "batch_norm: true, depth: 1, width: 16}\n"
                     "training: {lr: 0.01, batch_size: 32}\n")
    assert explore_run(space).exit_code == 0
    model = explore.load_model(tmp_path / "d.db", "d")
    test = load_digits().test
    sess = ort.InferenceSession(model.to_onnx().SerializeToString())
    (x,) = sess.get_inputs()
    assert x.name == "x" and x.type == "tensor(uint8)"
    probs, labels = sess.run(["probabilities", "label"], {"x": model.features(test.x)})
    np.testing.assert_allclose(probs, model.predict_proba(test.x), atol=1e-5)
    assert (labels == model.predict(test.x)).all()
    assert (labels == test.y).mean() > 0.8


def test_a_family_that_does_not_suit_the_data_is_refused_before_any_study(
        tmp_path: Path) -> None:
    space = tmp_path / "c.yaml"
    space.write_text("dataset: iris\nbudget: {trials: 1, rounds: 1, memory: 400MB}\n"
                     "model: {family: cnn, blocks: 1}\n")
    r = explore_run(space)
    assert r.exit_code == 2 and "family cnn needs images" in r.output, r.output
    assert "c.yaml:3: model: " in r.output, r.output
    assert not (tmp_path / "c.db").exists()


def test_explore_run_charges_what_the_run_adds_not_what_the_notebook_holds(
        tmp_path: Path) -> None:
    """A notebook holding 400 MB of its own runs a search with a 300 MB budget: the run
    is charged what the process grows by from the call on, plus its workers; its
    measured peak stays within the budget."""
    code = f"""
import numpy as np, explore
held = np.ones(400_000_000 // 8)            # the notebook's own data, every page touched
x = np.random.default_rng(0).normal(size=(300, 4)).astype("float32")
study = explore.run({{"dataset": {{"task": "regression"}}, "objectives": [{{"metric": "r2"}}],
                     "budget": {{"trials": 2, "rounds": 2, "memory": "300MB"}},
                     "keep_models": 0}},
                    data=(x, x.sum(axis=1)), storage="sqlite:///{tmp_path / 'n.db'}")
run = study.user_attrs["runs"][-1]
print(len(study.trials), run["measured_peak"], run["budget"])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    trials, peak, budget = map(int, r.stdout.split())
    assert trials == 2 and 0 < peak <= budget == 300_000_000
