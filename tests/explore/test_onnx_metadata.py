"""An exported model describes itself: its ONNX metadata (features in order, categories,
scaling, classes, task, version, study, trial, metrics, layout) and doc strings, read
back from the file; ``explore export-model`` prints its inputs and outputs and a
snippet that runs it, which runs."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import onnx
import optuna
import pandas as pd
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import explore
from explore.cli import main
from explore.datasets import Preprocess, load_digits
from explore.onnx_metadata import PREFIX, annotate, example_code, read_metadata
from explore.splits import split
from explore.study import RECORD_ATTR
from explore.trained import StoredData, TrainedModel

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")

BUDGET = {"trials": 1, "rounds": 2, "memory": "400MB", "workers": 1}
KEYS = {"version", "study", "trial", "task", "metrics", "features", "categorical",
        "scaling", "missing", "image", "classes", "inputs", "outputs"}


def churn(n: int = 160, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"age": rng.uniform(18, 80, n).round(),
                          "spend": rng.normal(50, 15, n),
                          "plan": rng.choice(["basic", "plus", "pro"], n),
                          "seats": rng.integers(1, 4, n)})
    frame["churned"] = np.where((frame.age > 50) ^ (frame.plan == "pro"), "yes", "no")
    return frame


TABLE_SPACE = {"name": "churn",
               "dataset": {"categorical": ["plan", "seats"], "valid": 0.25, "test": 0.25},
               "budget": BUDGET, "pruner": "none", "keep_models": 1,
               "model": {"depth": 1, "width": 8}, "training": {"lr": 0.02, "batch_size": 16}}


class Kept(NamedTuple):
    model: TrainedModel
    storage: str
    metrics: dict[str, float]  # the trial's, as the study records them


def kept(storage: str, study: optuna.Study) -> Kept:
    model = explore.load_model(storage, study.study_name)
    return Kept(model, storage, study.trials[model.trial].user_attrs[RECORD_ATTR]["metrics"])


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Kept:
    """A kept model of a table with a text and an integer category."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('table') / 'churn.db'}"
    return kept(storage, explore.run(TABLE_SPACE, data=churn(), target="churned",
                                     storage=storage))


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Kept:
    storage = f"sqlite:///{tmp_path_factory.mktemp('digits') / 'd.db'}"
    return kept(storage, explore.run(
        {"name": "d", "dataset": "digits", "budget": BUDGET, "pruner": "none",
         "keep_models": 1, "model": {"depth": 1, "width": 16},
         "training": {"lr": 0.01, "batch_size": 32}}, storage=storage))


def saved(proto: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """``proto`` written and read back, checked as onnxruntime's loaders would."""
    onnx.save(proto, str(path))
    back = onnx.load(str(path))
    onnx.checker.check_model(back, full_check=True)
    return back


def test_a_table_model_file_names_its_columns_categories_scaling_and_classes(
        table: Kept, tmp_path: Path) -> None:
    model, _, metrics = table
    proto = saved(annotate(model.to_onnx(), model, metrics=metrics), tmp_path / "m.onnx")
    meta = read_metadata(proto)
    assert set(meta) == KEYS
    assert meta["version"] == explore.__version__
    assert (meta["study"], meta["trial"], meta["task"]) == ("churn", model.trial,
                                                            "classification")
    assert meta["metrics"] == metrics and set(metrics) >= {"accuracy", "loss"}
    assert meta["features"] == ["age", "spend"] and meta["image"] is None
    assert meta["missing"] is None
    # categories and classes as the training split has them (explore.split: the rows
    # the search trained on), in encoding order
    train = split(TABLE_SPACE, data=churn(), target="churned").train
    assert meta["categorical"] == {"plan": sorted(set(train.plan)),
                                   "seats": sorted(int(v) for v in set(train.seats))}
    assert meta["classes"] == ["no", "yes"]
    s = meta["scaling"]
    assert s["method"] == "standard"
    np.testing.assert_allclose(s["offset"], train[["age", "spend"]].mean(), rtol=1e-9)
    # the scaling said is the one the model applies to x
    rows = churn(20, seed=5)
    raw = rows[["age", "spend"]].to_numpy()
    np.testing.assert_allclose((raw - s["offset"]) / s["scale"], model.features(rows)[:, :2],
                               rtol=1e-5, atol=1e-6)
    # the layout: each input's and output's doc string, and the same in explore.inputs
    docs = {v.name: v.doc_string for v in (*proto.graph.input, *proto.graph.output)}
    assert docs == {**meta["inputs"], **meta["outputs"]}
    assert docs["x"].startswith("float32 [N, 2]: the columns age, spend, in this order")
    assert docs["plan"].startswith("string [N, 1]: column 'plan', one of 'basic', 'plus', "
                                   "'pro'")
    assert docs["seats"].startswith("int64 [N, 1]: column 'seats', one of 1, 2, 3")
    assert docs["probabilities"].startswith("float32 [N, 2]:") and "'no', 'yes'" in \
        docs["probabilities"]
    assert docs["label"].startswith("string [N]: the most probable class")
    assert f"Trial {model.trial} of explore study 'churn'" in proto.doc_string
    assert proto.producer_version == explore.__version__
    # the classes are the probabilities' columns in order
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    probs, labels = sess.run(None, {"x": raw.astype(np.float32),
                                    "plan": rows[["plan"]].to_numpy().astype(object),
                                    "seats": rows[["seats"]].to_numpy().astype(np.int64)})
    assert list(np.asarray(meta["classes"])[probs.argmax(axis=1)]) == list(labels)


def test_an_image_model_file_says_its_pixels_and_image_shape(
        digits: Kept, tmp_path: Path) -> None:
    model = digits.model
    proto = saved(annotate(model.to_onnx(), model, metrics={"accuracy": 0.5}),
                  tmp_path / "d.onnx")
    meta = read_metadata(proto)
    assert set(meta) == KEYS
    assert meta["features"] is None and meta["categorical"] == {}
    assert meta["scaling"] == {"method": "pixels", "pixel_scale": 1 / 16, "max_pixel": 16}
    assert meta["image"] == [1, 8, 8] and meta["classes"] == list(range(10))
    (x,) = proto.graph.input
    assert x.doc_string == meta["inputs"]["x"] == (
        "uint8 [N, 64]: 1x8x8 images flattened (channel, row, column), integer pixels "
        "0..16; the model sees pixel * 0.0625")
    # pixel * scale is what the search trained on: the data set's own values
    test = load_digits().test
    k = model.features(test.x)
    assert k.dtype == np.uint8 and k.max() == meta["scaling"]["max_pixel"]
    np.testing.assert_array_equal(k * np.float32(meta["scaling"]["pixel_scale"]), test.x)


def test_annotating_again_replaces_its_own_keys_and_keeps_the_others(
        digits: Kept) -> None:
    model = digits.model
    proto = model.to_onnx()
    helper.set_model_props(proto, {"author": "me"})
    annotate(annotate(proto, model, metrics={"accuracy": 0.5}), model,
             metrics={"accuracy": 0.75, "f1": float("nan")})
    keys = [p.key for p in proto.metadata_props]
    assert sorted(keys) == sorted(["author", *(PREFIX + k for k in KEYS)])
    assert read_metadata(proto)["metrics"] == {"accuracy": 0.75, "f1": None}  # JSON: no NaN


def test_a_regression_file_says_its_prediction_is_in_the_targets_units() -> None:
    """A model the test makes by hand: the metadata is read off its data record and the
    graph's inputs and outputs alone."""
    pre = Preprocess(columns=("a", "b", "c"), numeric=("a", "b"), offset=(1.0, 2.0),
                     scale=(3.0, 4.0), categorical=("c",), categories=(("u", "v"),),
                     task="regression", target_scale=(10.0, 2.0), scaling="minmax",
                     impute="median", fill=(1.5, 2.5), fill_categories=("v",))
    data = StoredData("regression", 2, 0, None, None, (10.0, 2.0), pre)
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["prediction"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("c", TensorProto.STRING, ["N", 1])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["N"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model = SimpleNamespace(data=data, study="reg", trial=4)
    meta = read_metadata(annotate(proto, model))
    assert "metrics" not in meta  # this model knows none
    assert meta["classes"] is None and meta["task"] == "regression"
    assert meta["scaling"] == {"method": "minmax", "offset": [1.0, 2.0], "scale": [3.0, 4.0]}
    assert meta["missing"] == {"impute": "median", "numeric": {"a": 1.5, "b": 2.5},
                               "categorical": {"c": "v"}}
    assert meta["inputs"]["x"].endswith("; NaN takes its column's fill value: "
                                        "explore.missing")
    assert meta["outputs"] == {"prediction": "float32 [N]: the predicted target, in its "
                                             "units"}
    code = example_code(proto, "r.onnx")
    assert '"x": np.array([[2.5, 4]], np.float32),  # a, b' in code  # minmax: the middle
    assert '"c": np.array([["u"]], dtype=object),  # one of \'u\', \'v\'' in code
    assert "(prediction,) = sess.run(None, feeds)" in code


def export(storage: str, study: str, out: Path) -> str:
    """``explore export-model``'s output."""
    r = CliRunner().invoke(main, ["export-model", "--storage", storage, "--study", study,
                                  "--output", str(out)])
    assert r.exit_code == 0, r.output
    return r.output


def snippet(output: str) -> str:
    return output.split("run it with onnxruntime (pip install onnxruntime):\n", 1)[1]


def run_snippet(code: str) -> dict[str, object]:
    """The snippet run as a user would paste it; its variables."""
    ns: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, "<snippet>", "exec"), ns)
    ns["printed"] = printed.getvalue()
    return ns


def test_export_model_prints_the_layout_and_a_snippet_that_runs(
        table: Kept, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = table.model
    monkeypatch.chdir(tmp_path)  # the snippet names the file as --output did
    out = export(table.storage, "churn", Path("model.onnx"))
    lines = out.splitlines()
    assert lines[0] == f"trial {model.trial} of study 'churn' -> model.onnx"
    assert lines[1] == "inputs:" and lines[2].startswith(
        "  x: float32 [N, 2]: the columns age, spend, in this order")
    assert lines[3].startswith("  plan: string [N, 1]: column 'plan', one of 'basic', "
                               "'plus', 'pro'")
    assert lines[4].startswith("  seats: int64 [N, 1]: column 'seats', one of 1, 2, 3")
    assert lines[5] == "outputs:" and lines[6].startswith("  probabilities: float32 [N, 2]")
    assert lines[7].startswith("  label: string [N]")
    code = snippet(out)
    assert 'sess = ort.InferenceSession("model.onnx")' in code
    ns = run_snippet(code)
    feeds = ns["feeds"]
    assert isinstance(feeds, dict) and list(feeds) == ["x", "plan", "seats"]
    row = pd.DataFrame({"age": feeds["x"][:, 0], "spend": feeds["x"][:, 1],
                        "plan": feeds["plan"][:, 0], "seats": feeds["seats"][:, 0]})
    np.testing.assert_allclose(ns["probabilities"], model.predict_proba(row), rtol=1e-4,
                               atol=1e-6)
    assert list(ns["label"]) == list(model.predict(row))
    assert ns["printed"].strip() == str(ns["label"])
    # with real rows in place of the example one
    rows = churn(8, seed=9)
    real = code.replace("sess.run(None, feeds)", "sess.run(None, {"
                        "'x': rows[['age', 'spend']].to_numpy(np.float32), "
                        "'plan': rows[['plan']].to_numpy().astype(object), "
                        "'seats': rows[['seats']].to_numpy().astype(np.int64)})")
    ns = {"rows": rows}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(real, "<snippet>", "exec"), ns)
    assert list(ns["label"]) == list(model.predict(rows))


def test_export_model_of_an_image_model_prints_its_pixels(
        digits: Kept, tmp_path: Path) -> None:
    model = digits.model
    out = export(digits.storage, "d", tmp_path / "d.onnx")
    assert "  x: uint8 [N, 64]: 1x8x8 images flattened (channel, row, column), integer " \
           "pixels 0..16; the model sees pixel * 0.0625" in out.splitlines()
    ns = run_snippet(snippet(out))
    feeds = ns["feeds"]
    assert isinstance(feeds, dict)
    np.testing.assert_allclose(ns["probabilities"], model.predict_proba(feeds["x"]),
                               atol=1e-5)
    # the file written is the model: real digits give the engine's labels
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"))
    test = load_digits().test
    (labels,) = sess.run(["label"], {"x": model.features(test.x)})
    assert (labels == model.predict(test.x)).all()


def test_to_onnx_writes_the_metadata_and_a_loaded_model_knows_its_metrics(
        table: Kept) -> None:
    meta = read_metadata(table.model.to_onnx())
    assert set(meta) == KEYS and meta["metrics"] == table.metrics
