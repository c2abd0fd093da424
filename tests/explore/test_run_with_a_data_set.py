"""``explore.run(space, data=...)`` takes a data set made in Python as well as a
DataFrame or ``(X, y)``: sequences or a series built with their own options run as the
space's own data set would, and ``target`` (a DataFrame's column) is refused beside one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import explore
from explore.datasets import SequenceDataset, SeriesDataset
from explore.runner import RunRefused

SPACE = {"name": "given", "budget": {"trials": 2, "rounds": 2, "memory": "400MB",
                                     "workers": 1},
         "pruner": "none", "keep_models": 1,
         "training": {"lr": 0.003, "batch_size": 16}}


def tokens(n: int = 96, steps: int = 8, seed: int = 0) -> SequenceDataset:
    """Token rows padded with 0 past their lengths; the label: more high tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, steps + 1, n)
    x = rng.integers(1, 9, (n, steps))
    for i, k in enumerate(lengths):
        x[i, k:] = 0
    y = np.array([int((row[:k] > 4).sum() * 2 > k) for row, k in zip(x, lengths, strict=True)])
    return SequenceDataset(x, y, lengths=lengths, padding=0, test=0.2)


def test_a_sequence_data_set_made_in_python_is_searched_and_its_model_kept(
        tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'g.db'}"
    study = explore.run({**SPACE, "model": {"family": "transformer", "d_model": 8,
                                            "heads": 2, "layers": 1}},
                        data=tokens(), storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    model = explore.load_model(storage, "given")
    (x,) = model.to_onnx().graph.input
    assert x.name == "x" and x.type.tensor_type.elem_type == 7  # int64 token ids


def test_a_series_made_in_python_is_searched(tmp_path: Path) -> None:
    t = np.arange(200, dtype=np.float64)
    frame = pd.DataFrame({"load": np.sin(t / 6) + 0.01 * t})
    study = explore.run({**SPACE, "objectives": [{"metric": "mae", "direction": "minimize"}],
                         "model": {"family": "conv1d", "blocks": 1, "channels": 4,
                                   "kernel": 3, "readout": "last"}},
                        data=SeriesDataset(frame, "load", window=12),
                        storage=f"sqlite:///{tmp_path / 's.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert all(np.isfinite(t.value) for t in study.trials)


def test_a_target_beside_a_data_set_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    with pytest.raises(RunRefused, match="target='y' names a column of a DataFrame; a "
                                         "data set \\(SequenceDataset\\) knows its own"):
        explore.run({**SPACE, "model": {"family": "conv1d", "blocks": 1, "channels": 4,
                                        "kernel": 3}},
                    data=tokens(), target="y", storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_is_a_value_error_whose_message_says_what_is_wrong(
        tmp_path: Path) -> None:
    """A notebook shows the exception's message, not its ``errors``: they are in it, and
    ``except ValueError`` catches it, as the docstring of explore.run says."""
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    space = {"budget": {"trials": 1, "rounds": 1, "memory": "400MB"},
             "model": {"family": "mlp", "depth": 1, "width": 0}}
    with pytest.raises(ValueError, match=r"(?s)1 error\(s\).*model\.width: 0 is outside") as e:
        explore.run(space, data=(x, np.arange(40) % 2), storage=f"sqlite:///{tmp_path}/s.db")
    assert isinstance(e.value, RunRefused) and len(e.value.errors) == 1
    assert not (tmp_path / "s.db").exists()


def test_a_model_of_integer_named_columns_predicts_its_frame_and_says_what_rows_are_wrong(
        tmp_path: Path) -> None:
    """Columns named 0 and 1 are matched by name in predict as in training; rows that are
    no rows of numbers are refused saying what they are, not with numpy's own error."""
    from explore.datasets import DataError

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({0: rng.normal(size=80), 1: rng.normal(size=80),
                          "y": np.arange(80) % 2})
    space = {"budget": {"trials": 1, "rounds": 1, "memory": "400MB", "workers": 1},
             "model": {"family": "mlp", "depth": 1, "width": 8},
             "training": {"batch_size": 16}}
    storage = f"sqlite:///{tmp_path}/s.db"
    explore.run(space, data=frame, target="y", storage=storage, study="s")
    model = explore.load_model(storage, "s")
    x = frame[[0, 1]].to_numpy()
    np.testing.assert_array_equal(model.predict(frame), model.predict(x))
    assert model.predict(np.empty((0, 2))).shape == (0,)
    for rows, says in ((1.0, "rows are one value (float)"),
                       (x.astype(str), "rows are of dtype <U"),
                       ([[1.0, 2.0], [3.0]], "rows are not an array of numbers"),
                       (x[0], "one row? give it as [1, n]"),
                       (pd.DataFrame({0: ["x"] * 3, 1: [1.0] * 3}),
                        "column '0' is not numbers"),
                       (frame.assign(y=0).astype({1: "complex128"}),
                        "column '1' is complex128, not real numbers"),
                       (np.where(np.arange(2) == 1, np.nan, x[:1]),
                        "rows: '1' is nan at row 0: a model takes finite values"),
                       (np.where(np.arange(2) == 0, 1e39, x[:1]), "'0' is 1e+39 at row 0")):
        with pytest.raises(DataError, match=re.escape(says)):
            model.predict(rows)


@pytest.mark.parametrize(("given", "says"), [
    ({"study": 5}, "study: a name (a string), not int"),
    ({"storage": 5}, "storage: a URL or a SQLite file's path, not int"),
    ({"space": None}, "space: a file's path, a dict or a Space, not NoneType"),
    ({"space": {"budget": {"trials": 1, "rounds": 1, "memory": "400MB"},
                "dataset": {"seed": -1}}}, "dataset.seed: -1 is not an integer"),
    ({"target": ["y"]}, "target: one column's name, not list"),
    ({"space_changed": "yes"}, "space_changed: true or false, not 'yes'"),
])
def test_a_run_refuses_arguments_of_the_wrong_type_naming_them(
        tmp_path: Path, given: dict, says: str) -> None:
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    args = {"space": {"budget": {"trials": 1, "rounds": 1, "memory": "400MB"}},
            "data": pd.DataFrame({"a": x[:, 0], "y": np.arange(40) % 2}), "target": "y",
            "storage": f"sqlite:///{tmp_path}/s.db", **given}
    with pytest.raises(RunRefused, match=re.escape(says)):
        explore.run(**args)
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("trial", ["0", True, 0.5])
def test_a_trial_is_asked_for_by_its_number(tmp_path: Path, trial: object) -> None:
    """'0' was looked up and said no trial 0 was kept, while listing trial 0."""
    with pytest.raises(TypeError, match=r"trial: a trial's number \(an int\)"):
        explore.load_model(tmp_path / "s.db", "s", trial=trial)  # type: ignore[arg-type]
    assert not (tmp_path / "s.db").exists()


def test_results_name_the_studies_a_storage_has(tmp_path: Path) -> None:
    import optuna

    from explore.results import load

    storage = f"sqlite:///{tmp_path}/k.db"
    optuna.create_study(study_name="a", storage=storage)
    with pytest.raises(KeyError, match=r"no study 'b' in .*; studies there: 'a'"):
        load(storage, "b")
    with pytest.raises(TypeError, match="study: a study's name"):
        load(storage, None)  # type: ignore[arg-type]
