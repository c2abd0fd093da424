"""Sequence data sets: windows of a time series (``kind: series``, ``sunspots``), token
and feature arrays (``kind: sequences``) and MNIST row by row: their row layouts, the
time split without leakage, the checks with their messages, and the schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from explore import datasets
from explore.binding import bind
from explore.cli import main
from explore.datasets import (
    DataError,
    SequenceDataset,
    SequenceShape,
    SeriesDataset,
    _sunspots,
    seasonal_naive,
    sequences_from_file,
    series_from_file,
)
from explore.datasets.series import time_cuts, window_starts
from explore.space import load_space
from explore.yamlio import SpaceError

BUDGET = "budget: {trials: 1, rounds: 1, memory: 64MB}\n"


def weather(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return pd.DataFrame({"day": t, "load": np.sin(t / 6) * 10 + rng.normal(size=n) + 50,
                         "temp": rng.normal(20, 5, n), "kind": rng.choice(["a", "b"], n)})


# -- series: layout and split -----------------------------------------------------------------


def test_a_window_row_reshapes_to_its_steps_and_its_target_is_horizon_later() -> None:
    frame = weather()
    ds = SeriesDataset(frame, "load", columns=["load", "temp"], window=7, horizon=3,
                       stride=2, valid=0.25, test=0.15)
    assert ds.sequence == SequenceShape(7, 2) and ds.features == 14 and ds.image is None
    data = ds.load()
    p = ds.preprocess
    assert p is not None
    raw = frame[["load", "temp"]].to_numpy()
    for split, starts in zip((data.train, data.valid, data.test), ds.starts, strict=True):
        assert len(split) == len(starts) > 0
        for row, s in ((0, starts[0]), (-1, starts[-1])):
            steps = split.x[row].reshape(7, 2) * np.array(p.scale[:2]) + np.array(p.offset[:2])
            np.testing.assert_allclose(steps, raw[s:s + 7], rtol=1e-5)
            mean, std = ds.target_scale or (0.0, 1.0)
            assert split.y[row] * std + mean == pytest.approx(frame["load"][s + 6 + 3],
                                                                 rel=1e-5)
    assert np.all(np.diff(ds.starts[0]) == 2)  # stride
    assert p.feature_names[:2] == ("load[t-6]", "temp[t-6]")
    assert p.feature_names[-2:] == ("load[t]", "temp[t]")


def test_no_window_or_target_crosses_a_cut_and_scaling_sees_only_training_steps() -> None:
    frame = weather(200)
    ds = SeriesDataset(frame, "load", columns=["load", "temp"], window=10, horizon=2,
                       valid=0.2, test=0.2)
    a, b = ds.bounds
    assert (a, b) == time_cuts(200, 0.2, 0.2) == (120, 160)
    train, valid, test = ds.starts
    assert ds.target_index(train).max() < a <= valid.min()
    assert ds.target_index(valid).max() < b <= test.min()
    assert ds.target_index(test).max() < 200
    assert ds.rows == (120 - 12 + 1, 40 - 12 + 1, 40 - 12 + 1) and ds.valid == ds.rows[1]
    p = ds.preprocess
    assert p is not None
    part = frame[["load", "temp"]].to_numpy()[:a]
    np.testing.assert_allclose(p.offset[:2], part.mean(0))
    np.testing.assert_allclose(p.scale[:2], part.std(0))
    assert ds.target_scale == pytest.approx((part[:, 0].mean(), part[:, 0].std()))
    # the future changed beyond recognition: nothing fitted changes
    future = frame.copy()
    future.loc[a:, ["load", "temp"]] *= 1000
    other = SeriesDataset(future, "load", columns=["load", "temp"], window=10, horizon=2,
                          valid=0.2, test=0.2)
    assert other.preprocess == p and other.target_scale == ds.target_scale
    np.testing.assert_array_equal(other.load().train.x, ds.load().train.x)


def test_window_starts_and_minmax_and_a_time_column_to_sort_by() -> None:
    assert window_starts(5, 20, 4, 1, 3).tolist() == [5, 8, 11, 14]  # 14+3+1 = 18 < 20
    assert window_starts(0, 4, 4, 1, 1).tolist() == []
    frame = weather(80)
    shuffled = frame.sample(frac=1.0, random_state=3)
    a = SeriesDataset(frame, "load", window=5, scale="minmax")
    b = SeriesDataset(shuffled, "load", time="day", window=5, scale="minmax")
    np.testing.assert_array_equal(a.load().valid.x, b.load().valid.x)
    x = a.load().train.x
    assert x.min() == pytest.approx(0.0) and x.max() == pytest.approx(1.0)


def test_a_series_classification_learns_its_classes_on_the_training_part() -> None:
    t = np.arange(150)
    frame = pd.DataFrame({"v": np.sin(t / 4), "up": np.where(np.cos(t / 4) > 0, "up", "down")})
    ds = SeriesDataset(frame, "up", columns=["v"], window=6, task="classification")
    assert ds.classes == 2 and ds.outputs == 2 and ds.preprocess is not None
    assert ds.preprocess.labels == ("down", "up") and ds.target_scale is None
    y = ds.load().valid.y
    assert y.dtype == np.int64 and set(y.tolist()) == {0, 1}
    frame.loc[140:, "up"] = "flat"  # a class only the test part has
    with pytest.raises(DataError, match="'flat', a class the training split does not have"):
        SeriesDataset(frame, "up", columns=["v"], window=6, task="classification")


# -- series: the checks ---------------------------------------------------------------------


@pytest.mark.parametrize(("options", "key", "words"), [
    ({"window": 0}, "window", "at least 1, got 0"),
    ({"window": 5, "horizon": 0}, "horizon", "at least 1, got 0"),
    ({"window": 5, "stride": 2.5}, "stride", "got 2.5"),
    ({"window": 5, "columns": ["load", "nope"]}, "columns", "no column 'nope' (columns)"),
    ({"window": 5, "time": "when"}, "time", "no column 'when' (time)"),
    ({"window": 5, "columns": ["kind"]}, "columns", "input column 'kind' is object"),
    ({"window": 5, "columns": ["load", "load"]}, "columns", "'load' is listed twice"),
    ({"window": 5, "valid": 0.0}, "valid", "in (0, 1)"),
    ({"window": 5, "scale": "robust"}, "scale", "one of standard, minmax, none"),
    ({"window": 5, "task": "regression", "target": "kind", "columns": ["load"]}, "task",
     "not numbers"),
    ({"window": 5, "target": "kind"}, "target", "input column 'kind' is object"),
])
def test_bad_series_options_name_their_key(options: dict, key: str, words: str) -> None:
    target = options.pop("target", "load")
    with pytest.raises(DataError) as e:
        SeriesDataset(weather(), target, **options)
    assert e.value.key == key and words in str(e.value), str(e.value)


def test_too_few_steps_says_how_many_each_part_has_and_a_window_needs() -> None:
    with pytest.raises(DataError) as e:
        SeriesDataset(weather(100), "load", window=9, horizon=2)  # test: 10 steps < 11
    msg = str(e.value)
    assert e.value.key == "window" and "for the test part" in msg, msg
    assert "need 11 steps" in msg and "train 70, valid 20, test 10" in msg, msg
    # no test part asked for: none needed
    assert SeriesDataset(weather(100), "load", window=9, horizon=2, test=0.0).rows[2] == 0


def test_a_missing_value_names_its_column_row_and_line(tmp_path: Path) -> None:
    frame = weather(60)
    frame.loc[7, "temp"] = np.nan
    frame.to_csv(tmp_path / "w.csv", index=False)
    with pytest.raises(DataError) as e:
        series_from_file(tmp_path / "w.csv", "load", columns=["load", "temp"], window=5)
    msg = str(e.value)
    assert e.value.key == "columns" and "'temp'" in msg and "row 7 (line 9)" in msg, msg
    frame = weather(60)
    frame.loc[[3, 3 + 1], "day"] = 3
    with pytest.raises(DataError, match="'day' has 3 twice") as e:
        SeriesDataset(frame, "load", time="day", window=5)
    assert e.value.key == "time"
    with pytest.raises(DataError, match=r"a \.csv or \.parquet") as e:
        series_from_file(tmp_path / "w.npz", "load", window=5)
    assert e.value.key == "path"


# -- sunspots and the seasonal-naive baseline ---------------------------------------------


def test_sunspots_are_the_309_yearly_numbers_in_windows() -> None:
    named = datasets.get("sunspots")
    assert isinstance(named, _sunspots.Sunspots)
    ds = named.configure()
    assert ds.steps == 309 and ds.bounds == (185, 247) and ds.rows == (163, 40, 40)
    assert ds.target_values(np.array([0, 1, 308])).tolist() == [5.0, 11.0, 2.9]
    # the class attributes are the defaults' facts, known without reading the file
    assert (named.features, named.valid, named.sequence, named.task) == \
        (ds.features, ds.valid, ds.sequence, ds.task) == (22, 40, SequenceShape(22, 1),
                                                          "regression")
    other = named.configure(window=11, horizon=3, stride=2, test=0.1)
    assert other.sequence == SequenceShape(11, 1) and other.rows == (102, 25, 9)
    with pytest.raises(DataError) as e:
        named.configure(seed=3)
    assert e.value.key == "seed"


def test_sunspots_without_statsmodels_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sunspots.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install statsmodels"):
        _sunspots.Sunspots().configure()


def test_seasonal_naive_matches_a_hand_computation() -> None:
    ds = _sunspots.Sunspots().configure(window=12, horizon=1)
    y = ds.target_values(np.arange(ds.steps))
    got = seasonal_naive(ds, season=11)
    for name, starts in (("valid", ds.starts[1]), ("test", ds.starts[2])):
        errors = [y[s + 12] - y[s + 12 - 11] for s in starts]
        assert got[name].windows == len(starts)
        assert got[name].mae == pytest.approx(np.mean(np.abs(errors)))
        assert got[name].rmse == pytest.approx(np.sqrt(np.mean(np.square(errors))))
    # a horizon beyond the season: whole seasons back to a step the window has seen
    small = SeriesDataset({"v": np.arange(60.0) ** 2}, "v", window=4, horizon=5, test=0.0)
    err = seasonal_naive(small, season=2)["valid"]
    expect = [(s + 3 + 5) ** 2 - (s + 3 + 5 - 6) ** 2 for s in small.starts[1]]
    assert err.mae == pytest.approx(np.mean(np.abs(expect)))
    assert sorted(seasonal_naive(datasets.get("sunspots"), 11)) == ["test", "valid"]


# -- sequences of arrays ------------------------------------------------------------------


def tokens(n: int = 40, steps: int = 6, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, steps + 1, n)
    x = rng.integers(1, 9, (n, steps))  # ids 1..8; 0 is free for padding
    x[np.arange(steps) >= lengths[:, None]] = 77  # whatever was there
    return x, np.arange(n) % 2, lengths


def test_tokens_from_npy_files_are_padded_past_their_lengths(tmp_path: Path) -> None:
    x, y, lengths = tokens()
    for name, a in (("x", x), ("y", y), ("l", lengths)):
        np.save(tmp_path / f"{name}.npy", a)
    ds = sequences_from_file(x=tmp_path / "x.npy", y=tmp_path / "y.npy",
                             lengths=tmp_path / "l.npy", valid=0.25, test=0.25)
    assert ds.sequence == SequenceShape(6, 1, vocab=9, pad=0) and ds.features == 6
    assert ds.rows == (20, 10, 10) and ds.classes == 2
    data = ds.load()
    rows = np.concatenate([data.train.x, data.valid.x, data.test.x])
    assert rows.dtype == np.float32 and rows.max() == 8
    real = np.arange(6) < lengths[:, None]
    want = {tuple(r) for r in np.where(real, x, 0).astype(np.float32).tolist()}
    assert {tuple(r) for r in rows.tolist()} == want
    # the pad id given, and the vocabulary
    ds = SequenceDataset(x, y, lengths=lengths, padding=9, vocab=12)
    assert ds.sequence == SequenceShape(6, 1, vocab=12, pad=9)
    assert set(np.unique(ds.load().train.x).tolist()) <= set(range(1, 10))
    # a padding value alone marks the padded steps
    shape = SequenceDataset(np.where(real, x, 0), y, padding=0).sequence
    assert shape is not None and shape.pad == 0


def test_features_from_an_npz_carry_a_presence_flag_and_train_only_scaling(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, (50, 5, 2))
    lengths = rng.integers(1, 6, 50)
    real = np.arange(5) < lengths[:, None]
    x[~real] = 1e6  # padding the scaling must not see
    np.savez(tmp_path / "s.npz", x=x, y=rng.normal(size=50), lengths=lengths)
    ds = sequences_from_file(tmp_path / "s.npz", valid=0.2, seed=4)
    assert ds.sequence == SequenceShape(5, 2, masked=True) and ds.features == 15
    assert ds.task == "regression" and ds.target_scale is not None and ds.name == "s"
    train_rows = np.sort(ds._parts[0])
    seen = x[train_rows][real[train_rows]]
    p = ds.preprocess
    assert p is not None
    np.testing.assert_allclose(p.offset[:3], [*seen.mean(0), 0.0])
    np.testing.assert_allclose(p.scale[:3], [*seen.std(0), 1.0])
    steps = ds.load().train.x.reshape(-1, 5, 3)
    flags = steps[..., 2]
    assert set(np.unique(flags).tolist()) == {0.0, 1.0}
    assert np.all(steps[flags == 0][:, :2] == 0)  # padded values are zeros
    assert flags.sum() == real[ds._parts[0]].sum()


@pytest.mark.parametrize(("make", "key", "words"), [
    (lambda x, y, l: {"x": x, "y": y, "lengths": l + 6}, "lengths", "not in 1..6"),
    (lambda x, y, l: {"x": x, "y": y, "lengths": l * 0}, "lengths", "length 0, not in"),
    (lambda x, y, l: {"x": x, "y": y[:-1]}, "y", "x has 40 rows"),
    (lambda x, y, l: {"x": x[0], "y": y}, "x", "x is [6]"),
    (lambda x, y, l: {"x": x, "y": y, "lengths": l, "vocab": 5}, "x", "not below vocab 5"),
    (lambda x, y, l: {"x": x - 3, "y": y, "lengths": l}, "x", "ids are 0 or more"),
    (lambda x, y, l: {"x": x, "y": y, "lengths": l, "padding": 3}, "padding",
     "has the padding id 3 at step"),
    (lambda x, y, l: {"x": np.where(x == 77, 0, x) * 0, "y": y, "padding": 0}, "padding",
     "row 0 is all padding"),
    (lambda x, y, l: {"x": x[..., None] * 1.0, "y": y, "vocab": 9}, "vocab",
     "x holds features"),
    (lambda x, y, l: {"x": x, "y": y, "scale": "standard"}, "scale", "not scaled"),
    (lambda x, y, l: {"x": [[1, 2], [3]], "y": y[:2]}, "x", "ragged"),
])
def test_bad_sequences_name_their_key_and_row(make: object, key: str, words: str) -> None:
    x, y, lengths = tokens()
    args = make(x, y, lengths)  # type: ignore[operator]
    with pytest.raises(DataError) as e:
        SequenceDataset(args.pop("x"), args.pop("y"), **args)
    assert e.value.key == key and words in str(e.value), str(e.value)


def test_real_values_per_step_are_one_feature_a_step() -> None:
    """[rows, steps] of floats is a signal, one value a step (integers are token ids)."""
    x, y, _ = tokens()
    ds = SequenceDataset(x * 0.5, y, valid=0.25, seed=0)
    assert ds.sequence == SequenceShape(x.shape[1], 1)
    assert ds.load().train.x.shape[1] == x.shape[1]


def test_ragged_npy_and_npz_with_other_arrays_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array([[1, 2], [3]], dtype=object), allow_pickle=True)
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    with pytest.raises(DataError, match="ragged rows") as e:
        sequences_from_file(x=tmp_path / "x.npy", y=tmp_path / "y.npy")
    assert e.value.key == "x"
    np.savez(tmp_path / "s.npz", x=np.ones((4, 3), np.int64), y=np.ones(4), z=np.ones(4))
    with pytest.raises(DataError, match="x, y and optionally lengths; it has x, y, z"):
        sequences_from_file(tmp_path / "s.npz")


# -- MNIST row by row ---------------------------------------------------------------------


def test_mnist_rows_is_mnist_read_as_28_steps_of_28_pixels() -> None:
    rows, flat = datasets.get("mnist_rows"), datasets.get("mnist")
    assert rows.sequence == SequenceShape(28, 28) and rows.image is None
    assert rows.features == rows.sequence.features == flat.features
    assert (rows.valid, rows.classes, rows.pixel_scale) == \
        (flat.valid, flat.classes, flat.pixel_scale)
    a, b = rows.load_compact(50, 20), flat.load_compact(50, 20)
    assert a.name == "mnist_rows" and a.train.x.dtype == np.uint8
    np.testing.assert_array_equal(a.train.x, b.train.x)
    np.testing.assert_array_equal(a.valid.y, b.valid.y)
    # step i of a row is the image's pixel row i
    image = b.train.x[0].reshape(28, 28)
    np.testing.assert_array_equal(a.train.x[0].reshape(28, 28)[13], image[13])


# -- the schema ---------------------------------------------------------------------------


def write_space(tmp_path: Path, dataset: str) -> Path:
    f = tmp_path / "space.yaml"
    f.write_text(f"dataset:\n{dataset}{BUDGET}")
    return f


def test_the_space_loader_resolves_each_kind(tmp_path: Path) -> None:
    weather(120).to_csv(tmp_path / "w.csv", index=False)
    x, y, lengths = tokens()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "l.npy", lengths)
    np.savez(tmp_path / "f.npz", x=np.ones((20, 4, 3)), y=np.arange(20) % 2)
    cases = {
        "  kind: series\n  path: w.csv\n  target: load\n  columns: [load, temp]\n"
        "  time: day\n  window: 8\n  horizon: 2\n  stride: 2\n  valid: 0.2\n  test: 0.1\n":
            SequenceShape(8, 2),
        "  kind: sequences\n  x: x.npy\n  y: y.npy\n  lengths: l.npy\n  padding: 0\n":
            SequenceShape(6, 1, vocab=9, pad=0),
        "  kind: sequences\n  path: f.npz\n  valid: 0.25\n  seed: 2\n": SequenceShape(4, 3),
        "  name: sunspots\n  window: 11\n  horizon: 2\n": SequenceShape(11, 1),
    }
    for text, shape in cases.items():
        space = load_space(write_space(tmp_path, text))
        assert bind(space).data.sequence == shape, text
    table = load_space(write_space(tmp_path, "  path: w.csv\n  target: load\n  features: [temp]\n"))
    assert table.dataset is not None and table.dataset.kind is None
    assert bind(table).data.sequence is None
    result = CliRunner().invoke(main, ["size", str(write_space(tmp_path, next(iter(cases))))])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("text", "key", "words"), [
    ("  path: w.csv\n  target: load\n  window: 8\n", "window",
     "window is for kind: series; this dataset is kind: table (the default)"),
    ("  kind: series\n  path: w.csv\n  target: load\n  window: 8\n  lengths: l.npy\n",
     "lengths", "lengths is for kind: sequences"),
    ("  kind: series\n  path: w.csv\n  target: load\n  window: 8\n  missing: drop\n",
     "missing", "missing is for kind: table"),
    ("  kind: series\n  path: w.csv\n  target: load\n", "kind", "window: the steps"),
    ("  kind: series\n  path: w.csv\n  target: load\n  window: 0\n", "window",
     "greater than or equal to 1"),
    ("  kind: series\n  path: w.csv\n  target: load\n  window: 8\n  seed: 1\n", "seed",
     "split in time order"),
    ("  kind: series\n  path: w.csv\n  target: load\n  window: 8\n  test: t.csv\n", "test",
     "a fraction"),
    ("  kind: sequences\n  path: f.npz\n  window: 3\n", "window", "is for kind: series"),
    ("  kind: sequences\n  path: f.csv\n", "path", "reads an .npz"),
    ("  name: sunspots\n  kind: series\n", "kind", "named dataset 'sunspots' has its own"),
    ("  name: sunspots\n  vocab: 3\n", "vocab", "a named dataset has none"),
])
def test_kind_keys_are_refused_elsewhere_at_their_line(tmp_path: Path, text: str, key: str,
                                                       words: str) -> None:
    f = write_space(tmp_path, text)
    with pytest.raises(SpaceError) as e:
        load_space(f)
    msg = str(e.value)
    line = 2 + next(i for i, t in enumerate(text.splitlines()) if t.strip().startswith(key))
    assert f"{f}:{line}:" in msg and f"dataset.{key}:" in msg and words in msg, msg


def test_data_errors_of_a_kind_point_at_their_key(tmp_path: Path) -> None:
    weather(40).to_csv(tmp_path / "w.csv", index=False)
    space = load_space(write_space(
        tmp_path, "  kind: series\n  path: w.csv\n  target: load\n  window: 30\n"))
    with pytest.raises(SpaceError) as e:
        bind(space)
    assert f"{tmp_path / 'space.yaml'}:5:" in str(e.value) and "too few" in str(e.value)
    space = load_space(write_space(tmp_path, "  name: iris\n  window: 3\n"))
    with pytest.raises(SpaceError, match="'iris' takes no window; its options"):
        bind(space)
