"""A sequence model leaves a search as one ONNX file that takes the sequences as they
come: a series' raw windows ``[N, window, columns]`` (the scaling inside), token ids
``[N, length]`` int64 (padding masked inside), feature steps with their presence flags.
Checked by onnx.checker, and onnxruntime gives what the kept model predicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd
import pytest

import explore
from explore.datasets.series import series_from_file

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")

BUDGET = {"trials": 1, "rounds": 3, "memory": "400MB", "workers": 1}


def search(tmp: Path, name: str, dataset: dict[str, Any], model: dict[str, Any],
           task_metric: str) -> Any:
    storage = f"sqlite:///{tmp / f'{name}.db'}"
    explore.run({"name": name, "dataset": dataset, "budget": BUDGET, "pruner": "none",
                 "keep_models": 1, "objectives": [{"metric": task_metric}],
                 "model": {"depth": 0, **model},
                 "training": {"lr": 0.01, "batch_size": 16}}, storage=storage)
    return explore.load_model(storage, name)


def exported(model: Any, path: Path) -> Any:
    onnx.save(model.to_onnx(), str(path))
    back = onnx.load(str(path))
    onnx.checker.check_model(back, full_check=True)
    return ort.InferenceSession(str(path))


def test_a_forecaster_takes_raw_windows(tmp_path: Path) -> None:
    t = np.arange(400)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"load": 100 + 20 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 1, 400),
                          "temp": 15 + 5 * np.cos(2 * np.pi * t / 12)})
    csv = tmp_path / "load.csv"
    frame.to_csv(csv, index=False)
    dataset = {"kind": "series", "path": str(csv), "target": "load",
               "columns": ["load", "temp"], "window": 12}
    model = search(tmp_path, "load", dataset,
                   {"family": "conv1d", "blocks": 1, "channels": 8, "kernel": 3,
                    "pool": False}, "mae")
    sess = exported(model, tmp_path / "load.onnx")
    (given,) = sess.get_inputs()
    assert given.name == "x" and given.shape[1:] == [12, 2]
    windows = np.lib.stride_tricks.sliding_window_view(
        frame[["load", "temp"]].to_numpy(np.float32), 12, axis=0).transpose(0, 2, 1)
    raw = np.ascontiguousarray(windows[-41:-1])  # the last windows with a next step
    (prediction,) = sess.run(["prediction"], {"x": raw})
    np.testing.assert_allclose(prediction, model.predict(raw), rtol=1e-4, atol=1e-3)
    # a raw window becomes the row the model was trained and tested on: the scaling
    # inside is the one fitted on the training part
    rows = series_from_file(csv, "load", columns=["load", "temp"], window=12).load()
    np.testing.assert_allclose(model.features(raw[-1:]), rows.test.x[-1:], rtol=1e-5,
                               atol=1e-5)


def test_a_token_model_takes_ids(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n, length = 240, 10
    ids = rng.integers(1, 20, (n, length))
    lengths = rng.integers(3, length + 1, n)
    y = (ids[:, 0] > 10).astype(np.int64)
    np.savez(tmp_path / "tokens.npz", x=ids, y=y, lengths=lengths)
    model = search(tmp_path, "tokens", {"kind": "sequences", "path": str(tmp_path / "tokens.npz")},
                   {"family": "transformer", "d_model": 16, "heads": 2, "layers": 1,
                    "ff_ratio": 2, "pooling": "cls"}, "accuracy")
    sess = exported(model, tmp_path / "tokens.onnx")
    (given,) = sess.get_inputs()
    assert given.type == "tensor(int64)" and given.shape[1:] == [length]
    padded = ids.copy()
    padded[np.arange(length) >= lengths[:, None]] = 0  # the pad id, as the data set pads
    probs, labels = sess.run(["probabilities", "label"], {"x": padded[:32]})
    np.testing.assert_allclose(probs, model.predict_proba(padded[:32]), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(labels, model.predict(padded[:32]))


def test_a_feature_sequence_model_takes_steps_and_flags(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    n, length, feats = 200, 8, 3
    x = rng.standard_normal((n, length, feats)).astype(np.float32)
    lengths = rng.integers(2, length + 1, n)
    y = (x[:, 0, 0] > 0).astype(np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "l.npy", lengths)
    model = search(tmp_path, "steps", {"kind": "sequences", "x": str(tmp_path / "x.npy"),
                                       "y": str(tmp_path / "y.npy"),
                                       "lengths": str(tmp_path / "l.npy")},
                   {"family": "transformer", "d_model": 8, "heads": 2, "layers": 1,
                    "ff_ratio": 2}, "accuracy")
    sess = exported(model, tmp_path / "steps.onnx")
    (given,) = sess.get_inputs()
    assert given.shape[1:] == [length, feats + 1]
    present = (np.arange(length) < lengths[:, None]).astype(np.float32)
    steps = np.concatenate([x * present[..., None], present[..., None]], axis=2)[:32]
    probs = sess.run(["probabilities"], {"x": steps})[0]
    np.testing.assert_allclose(probs, model.predict_proba(steps), rtol=1e-4, atol=1e-5)
    # what a padded step holds changes nothing, in the file as in the search
    noisy = steps.copy()
    noisy[..., :feats] += (1 - noisy[..., feats:]) * 50
    np.testing.assert_allclose(sess.run(["probabilities"], {"x": noisy})[0], probs,
                               rtol=1e-4, atol=1e-5)
