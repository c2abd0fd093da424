"""``explore.splits.split``: the train, valid and test rows of a space's data set, as
the user has them, are the rows a search of it trains, validates and tests on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explore.datasets import DataError, load_digits, quantize
from explore.runner import prepare
from explore.splits import Part, Splits, split
from explore.yamlio import SpaceError

BUDGET = {"trials": 1, "rounds": 1, "memory": "1GB"}


def churn(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"age": rng.uniform(18, 80, n).round(),
                          "notes": "unused",
                          "plan": rng.choice(["basic", "plus", "pro"], n),
                          "churned": rng.choice(["no", "yes"], n, p=[0.7, 0.3])},
                         index=pd.RangeIndex(1000, 1000 + n))
    return frame


def searched(space: dict | Path, data: object = None, target: str | None = None,
             tmp: Path | None = None) -> tuple[object, tuple[int | None, int | None]]:
    """The data set a run binds (explore.runner.prepare, as explore.run does) and its
    row limits."""
    storage = f"sqlite:///{tmp / 'x.db'}" if tmp else None
    prep = prepare(space, data=data, target=target, storage=storage)
    ds = prep.bound.data
    heads = prep.space.dataset.heads if prep.space.dataset is not None else (None, None)
    return ds, heads


def assert_partition(s: Splits, index: pd.Index) -> None:
    parts = [p.index for p in s]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not set(parts[a]) & set(parts[b])
    assert sorted(np.concatenate([np.asarray(p) for p in parts]).tolist()) == \
        sorted(index.tolist())


def test_a_dataframes_split_is_the_search_rows_as_the_user_has_them(tmp_path: Path) -> None:
    frame = churn()
    space = {"dataset": {"features": ["age", "plan"], "categorical": ["plan"],
                         "valid": 0.25, "test": 0.25, "seed": 3}, "budget": BUDGET}
    s = split(space, data=frame, target="churned")
    assert isinstance(s, Splits) and [len(p) for p in s] == [60, 30, 30]
    for part in s:  # the user's columns (those the search used), the target last
        assert list(part.columns) == ["age", "plan", "churned"]
        pd.testing.assert_frame_equal(part, frame.loc[part.index, ["age", "plan", "churned"]])
    assert_partition(s, frame.index)
    # the search's own rows, preprocessed: the same, in the same order
    ds, _ = searched(space, frame, "churned", tmp_path)
    data = ds.load()
    for part, want in zip(s, (data.train, data.valid, data.test), strict=True):
        np.testing.assert_array_equal(ds.preprocess.transform(part), want.x)
        labels = np.asarray(ds.preprocess.labels)[want.y]
        assert list(labels) == list(part.churned)
    # stratified: each class keeps its share
    share = frame.churned.value_counts(normalize=True)
    for part in s:
        got = part.churned.value_counts(normalize=True)
        assert (abs(got - share) < 0.05).all()


def test_a_space_files_row_limits_are_the_rows_the_search_trains_and_validates_on(
        tmp_path: Path) -> None:
    churn(200).to_csv(tmp_path / "churn.csv", index=False)
    space = tmp_path / "churn.yaml"
    space.write_text("dataset: {path: churn.csv, target: churned, categorical: [plan],\n"
                     "          features: [age, plan], train: 50, valid: 20, test: 0.2}\n"
                     "budget: {trials: 1, rounds: 1, memory: 1GB}\n")
    s = split(space)
    assert [len(p) for p in s] == [50, 20, 40]
    ds, heads = searched(space)
    assert heads == (50, 20)
    run = ds.load_compact(*heads)  # what the run puts in its shared memory
    np.testing.assert_array_equal(ds.preprocess.transform(s.train), run.train.x)
    np.testing.assert_array_equal(ds.preprocess.transform(s.valid), run.valid.x)
    # the file's own rows: the index is the row's position in it
    whole = pd.read_csv(tmp_path / "churn.csv")
    pd.testing.assert_frame_equal(s.test, whole.loc[s.test.index, ["age", "plan", "churned"]])


def test_a_built_in_table_gives_its_named_columns_and_y(tmp_path: Path) -> None:
    s = split({"dataset": "wine", "budget": BUDGET})
    assert [len(p) for p in s] == [106, 36, 36]
    assert list(s.train.columns)[:2] == ["alcohol", "malic_acid"]
    assert list(s.train.columns)[-1] == "y" and set(s.test.y) == {0, 1, 2}
    assert_partition(s, pd.RangeIndex(178))
    ds, _ = searched({"dataset": "wine", "budget": BUDGET}, tmp=tmp_path)
    np.testing.assert_array_equal(ds.preprocess.transform(s.valid.iloc[:, :-1]),
                                  ds.load().valid.x)


def test_arrays_give_a_frame_of_x0_x1_and_y_indexed_by_position() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    s = split({"dataset": {"valid": 0.25, "task": "regression"}, "budget": BUDGET},
              data=(x, y))
    assert list(s.train.columns) == ["x0", "x1", "x2", "y"] and len(s.test) == 0
    assert_partition(s, pd.RangeIndex(40))
    np.testing.assert_array_equal(s.valid[["x0", "x1", "x2"]].to_numpy(), x[s.valid.index])
    np.testing.assert_array_equal(s.valid.y.to_numpy(), y[s.valid.index])  # raw, not scaled


def test_image_arrays_give_arrays() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (30, 4, 4)).astype(np.uint8)
    y = np.arange(30) % 2
    s = split({"dataset": {"valid": 0.2, "test": 0.2, "scale": "none"}, "budget": BUDGET},
              data=(x, y))
    assert all(isinstance(p, Part) for p in s) and [len(p.x) for p in s] == [18, 6, 6]
    assert s.train.x.shape[1:] == (4, 4) and s.train.x.dtype == np.uint8
    seen = {p.tobytes() for part in s for p in part.x}
    assert seen == {p.tobytes() for p in x}


def test_digits_gives_the_search_images_with_its_limits(tmp_path: Path) -> None:
    space = {"dataset": {"name": "digits", "train": 100, "valid": 50}, "budget": BUDGET}
    s = split(space)
    assert [len(p.x) for p in s] == [100, 50, 360]
    whole = load_digits()
    np.testing.assert_array_equal(s.train.x, whole.train.x[:100])
    np.testing.assert_array_equal(s.test.y, whole.test.y)
    ds, heads = searched(space, tmp=tmp_path)
    run = ds.load_compact(*heads)  # uint8 pixels: the same images
    np.testing.assert_array_equal(quantize(s.train.x, ds.pixel_scale), run.train.x)
    np.testing.assert_array_equal(s.valid.y, run.valid.y)


def test_a_bad_space_or_bad_data_is_refused_where_it_is_wrong(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("dataset: {name: digits}\nbudget: {trials: 1, rounds: 1, memory: 1GB}\n"
                 "model: {widht: 3}\n")
    with pytest.raises(SpaceError, match=r"s\.yaml:3: model.*widht"):
        split(f)
    with pytest.raises(DataError, match="target"):
        split({"dataset": {"valid": 0.2}, "budget": BUDGET}, data=churn())
