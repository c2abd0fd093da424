"""Users' own data: every file form and Python form, both tasks, the preprocessing
fitted on the training split only, the checks with their messages, and the schema."""

from __future__ import annotations

import datetime
import decimal
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explore import datasets
from explore.binding import bind
from explore.datasets import DataError, Preprocess, from_file, from_python
from explore.datasets.split import split_rows
from explore.scheduler.shared_data import load_shared
from explore.space import load_space, parse_space
from explore.yamlio import SpaceError

BUDGET = "budget: {trials: 1, rounds: 1, memory: 64MB}\n"


def churn(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "age": rng.integers(18, 80, n),
        "spend": rng.normal(50.0, 10.0, n).round(2),
        "plan": rng.choice(["basic", "pro", "team"], n),
        "churned": np.tile(["no", "no", "yes"], n // 3 + 1)[:n],
    })


# -- the forms --------------------------------------------------------------------------------


def test_csv_classification_with_text_labels_and_a_categorical(tmp_path: Path) -> None:
    frame = churn()
    frame.to_csv(tmp_path / "churn.csv", index=False)
    ds = from_file(tmp_path / "churn.csv", "churned", categorical=["plan"], valid=0.25,
                   test=0.1)
    p = ds.preprocess
    assert p is not None and p.labels == ("no", "yes") and ds.classes == 2 == ds.outputs
    assert p.feature_names[:2] == ("age", "spend") and ds.features == 2 + 3
    assert ds.rows == (39, 15, 6) and ds.valid == 15 and ds.image is None
    data = ds.load()
    assert data.train.x.dtype == np.float32 and data.train.y.dtype == np.int64
    assert data.train.x.shape == (39, 5) and len(data.test) == 6
    # the labels map back to the original values of the same rows
    back = p.labels_of(data.train.y)
    assert set(back) == {"no", "yes"}


def test_parquet_regression_standardizes_the_target(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"a": rng.normal(size=50), "b": rng.normal(size=50)})
    frame["price"] = 3 * frame["a"] + 100.5
    frame.to_parquet(tmp_path / "p.parquet")
    ds = from_file(tmp_path / "p.parquet", "price")
    assert ds.task == "regression" and ds.classes == 0 and ds.outputs == 1
    data = ds.load()
    assert data.train.y.dtype == np.float32
    mean, std = ds.target_scale or (0, 0)
    np.testing.assert_allclose(data.train.y.mean(), 0, atol=1e-6)
    np.testing.assert_allclose(data.train.y.std(), 1, atol=1e-6)
    assert ds.preprocess is not None
    back = ds.preprocess.unscale(data.valid.y)  # the prices of the validation rows
    assert np.isin(np.round(back, 3), np.round(frame["price"].to_numpy(), 3)).all()
    assert mean > 90 and std > 0


def test_npz_names_its_target_and_features_arrays(tmp_path: Path) -> None:
    x = np.arange(120.0).reshape(40, 3)
    np.savez(tmp_path / "d.npz", inputs=x, labels=np.arange(40) % 2, extra=np.zeros(2))
    ds = from_file(tmp_path / "d.npz", "labels", features=["inputs"])
    assert ds.features == 3 and ds.classes == 2
    with pytest.raises(DataError, match="2 arrays besides the target"):
        from_file(tmp_path / "d.npz", "labels")
    with pytest.raises(DataError, match=r"no array 'y'.*inputs, labels, extra"):
        from_file(tmp_path / "d.npz", "y")


def test_an_npy_pair_is_memory_mapped_and_written_into_the_shared_file(
        tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    np.save(tmp_path / "X.npy", x)
    np.save(tmp_path / "y.npy", np.arange(300) % 3)
    ds = from_file(x=tmp_path / "X.npy", y=tmp_path / "y.npy", valid=0.2)
    sources = ds._read()
    assert isinstance(sources[0].x, np.memmap)  # not read into memory
    f = tmp_path / "s.yaml"
    f.write_text(f"dataset: {{x: X.npy, y: y.npy, valid: 0.2}}\n{BUDGET}")
    bound = bind(load_space(f))
    with load_shared(bound) as shared:
        assert set(shared.spec) == {"x_train", "y_train", "x_valid", "y_valid"}
        assert shared.arrays["x_train"].shape == (240, 4)
        full = bound.data.load()
        np.testing.assert_array_equal(shared.arrays["x_train"], full.train.x)
        np.testing.assert_array_equal(shared.arrays["y_valid"], full.valid.y)


def test_uint8_images_with_scale_none_stay_uint8(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (50, 6, 6), dtype=np.uint8)
    np.save(tmp_path / "X.npy", x)
    np.save(tmp_path / "y.npy", np.arange(50) % 2)
    ds = from_file(x=tmp_path / "X.npy", y=tmp_path / "y.npy", scale="none")
    assert ds.pixel_scale == 1.0 and ds.image == (1, 6, 6) and ds.features == 36
    small = ds.load_compact(train=10)
    assert small.train.x.dtype == np.uint8
    np.testing.assert_array_equal(small.train.x, ds.load().train.x[:10].astype(np.uint8))


def test_a_dataframe_from_python() -> None:
    ds = from_python(churn(), target="churned", categorical=["plan"])
    assert ds.features == 5 and ds.task == "classification"


def test_arrays_and_lists_from_python() -> None:
    x = np.random.default_rng(0).normal(size=(30, 2))
    ds = from_python((x, x[:, 0] * 2.5))
    assert ds.task == "regression" and ds.preprocess is not None
    assert ds.preprocess.numeric == ("x0", "x1")
    ds = from_python(([[1.0, 2.0]] * 10, [3, 7] * 5))
    assert ds.preprocess is not None and ds.preprocess.labels == (3, 7)
    data = ds.load()
    assert set(np.unique(data.train.y)) <= {0, 1}


# -- the preprocessing: fitted on the training split only ------------------------------------


def test_scaling_is_fitted_on_the_training_rows_only() -> None:
    x = np.arange(100.0).reshape(50, 2)
    x[:, 1] **= 2
    y = np.arange(50.0) * 0.5 + 0.25
    for scale in ("standard", "minmax", "none"):
        ds = from_python((x, y), scale=scale, valid=0.2, seed=3)
        train, _, _ = split_rows(50, 0.2, 0.0, seed=3)
        t = x[np.sort(train)]  # summed in file order
        p = ds.preprocess
        assert p is not None
        if scale == "standard":
            assert p.offset == tuple(t.mean(0)) and p.scale == tuple(t.std(0))
        elif scale == "minmax":
            assert p.offset == tuple(t.min(0)) and p.scale == tuple(t.max(0) - t.min(0))
        else:
            assert p.offset == (0.0, 0.0) and p.scale == (1.0, 1.0)
        data = ds.load()
        expect = ((x[train] - np.array(p.offset)) / np.array(p.scale)).astype(np.float32)
        np.testing.assert_array_equal(data.train.x, expect)
        assert ds.target_scale == (y[train].mean(), y[train].std())  # (order: y is small)


def test_categories_are_learned_on_the_training_split_only() -> None:
    frame = churn(30)
    frame.loc[frame.index[-1], "plan"] = "rare"
    ds = from_python(frame, "churned", categorical=["plan"], valid=0.2, seed=0)
    train, valid, _ = split_rows(30, 0.2, 0.0, seed=0,
                                 classes=(frame["churned"] == "yes").to_numpy().astype(int))
    assert ds.preprocess is not None
    seen = tuple(sorted(set(frame["plan"].iloc[train])))
    assert ds.preprocess.categories == (seen,)
    data = ds.load()
    where = np.flatnonzero(valid == 29)
    if "rare" not in seen and len(where):  # unknown in training: all zeros
        assert data.valid.x[where[0], 2:].sum() == 0
    # the one-hot block of each training row has exactly one 1
    np.testing.assert_array_equal(data.train.x[:, 2:].sum(1), 1)


def test_integer_categories_stay_integers() -> None:
    frame = pd.DataFrame({"zone": [3, 7, 3, 7, 9] * 4, "v": np.arange(20.0),
                          "t": [0, 1] * 10})
    ds = from_python(frame, "t", categorical=["zone"])
    assert ds.preprocess is not None and ds.preprocess.categories == ((3, 7, 9),)
    assert ds.preprocess.feature_names == ("v", "zone=3", "zone=7", "zone=9")


def test_preprocess_round_trips_and_transforms_raw_rows_as_training_saw_them() -> None:
    import json

    frame = churn()
    ds = from_python(frame, "churned", categorical=["plan"], valid=0.2, test=0.2)
    p = ds.preprocess
    assert p is not None
    again = Preprocess.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p
    train, _, _ = split_rows(len(frame), 0.2, 0.2, seed=0, classes=(
        frame["churned"] == "yes").to_numpy().astype(int))
    np.testing.assert_array_equal(again.transform(frame.iloc[train]), ds.load().train.x)
    num = from_python((np.arange(20.0).reshape(10, 2), [0, 1] * 5))
    assert num.preprocess is not None
    np.testing.assert_array_equal(num.preprocess.transform(np.arange(20.0).reshape(10, 2))
                                  [split_rows(10, 0.2, 0.0, classes=np.array([0, 1] * 5))[0]],
                                  num.load().train.x)


def test_a_stratified_split_keeps_the_class_proportions() -> None:
    y = np.repeat([0, 1, 2], [500, 300, 200])
    tr, va, te = split_rows(1000, 0.2, 0.1, seed=7, classes=y)
    assert np.bincount(y[va]).tolist() == [100, 60, 40]
    assert np.bincount(y[te]).tolist() == [50, 30, 20]
    assert len(set(tr) | set(va) | set(te)) == 1000
    again = split_rows(1000, 0.2, 0.1, seed=7, classes=y)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again, strict=True))
    assert not np.array_equal(split_rows(1000, 0.2, 0.1, seed=8, classes=y)[0], tr)


# -- bad data: a DataError that names what is wrong --------------------------------------------


def _csv(tmp_path: Path, frame: pd.DataFrame) -> Path:
    f = tmp_path / "d.csv"
    frame.to_csv(f, index=False)
    return f


def test_a_missing_file_and_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        from_file(tmp_path / "nope.csv", "t")
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"unknown format '\.xlsx'.*\.csv, \.parquet"):
        from_file(tmp_path / "d.xlsx", "t")


def test_a_missing_column_is_named_with_the_available_ones(tmp_path: Path) -> None:
    f = _csv(tmp_path, churn())
    with pytest.raises(DataError, match="no column 'churn'; columns: age, spend, plan, churned"):
        from_file(f, "churn", categorical=["plan"])
    with pytest.raises(DataError, match="no column 'height'"):
        from_file(f, "churned", features=["age", "height"])


def test_text_columns_must_be_declared_categorical(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"columns plan are not numeric; list them under categ"):
        from_file(_csv(tmp_path, churn()), "churned")


@pytest.mark.parametrize(("bad", "what"), [(np.nan, "missing"), (np.inf, "infinite")])
def test_missing_and_infinite_values_give_their_index_and_column(tmp_path: Path, bad: float,
                                                                 what: str) -> None:
    """Labelled as pandas shows them (the index), with a CSV's line (header: line 1)."""
    frame = churn()
    frame["spend"] = frame["spend"].astype(float)
    frame.loc[6, "spend"] = bad
    kind = "infinite (in float32)" if what == "infinite" else what
    with pytest.raises(DataError, match=rf"d\.csv: {re.escape(kind)} values in 1 column") as e:
        from_file(_csv(tmp_path, frame), "churned", categorical=["plan"])
    assert f"'spend': 1 {what}, at index 6 (line 8)" in str(e.value)
    frame = churn()
    frame.loc[4, "plan"] = None
    with pytest.raises(DataError, match=r"'plan': 1 missing, at index 4\n"):
        from_python(frame, "churned", categorical=["plan"])
    x = np.ones((10, 2))
    x[8, 1] = bad
    with pytest.raises(DataError, match=rf"'x1': 1 {what}, at row 8\n"):
        from_python((x, [0, 1] * 5))


def test_a_target_of_one_class_is_refused() -> None:
    with pytest.raises(DataError, match=r"one class \('yes'\)"):
        from_python((np.ones((10, 1)), ["yes"] * 10))


def test_x_and_y_of_different_lengths(tmp_path: Path) -> None:
    np.save(tmp_path / "X.npy", np.ones((10, 2)))
    np.save(tmp_path / "y.npy", np.zeros(9))
    with pytest.raises(DataError, match="x has 10 rows and y has 9"):
        from_file(x=tmp_path / "X.npy", y=tmp_path / "y.npy")


def test_too_few_rows_for_the_splits() -> None:
    with pytest.raises(DataError, match="too few rows"):
        from_python((np.ones((2, 1)), [0.5, 1.5]), valid=0.5, test=0.5)
    # stratified: every class keeps a row in training
    with pytest.raises(DataError, match="every class keeps a row"):
        from_python((np.ones((3, 1)), ["a", "b", "c"]), valid=0.4)


def test_a_regression_target_must_be_numeric() -> None:
    with pytest.raises(DataError, match="regression needs a numeric target"):
        from_python((np.ones((10, 1)), ["a", "b"] * 5), task="regression")


def test_duplicate_and_overlapping_names() -> None:
    frame = churn()
    with pytest.raises(DataError, match="target 'churned' is also listed in features"):
        from_python(frame, "churned", features=["age", "churned"])
    with pytest.raises(DataError, match="features lists a column twice: age"):
        from_python(frame, "churned", features=["age", "age"])


def test_a_float_target_with_many_values_is_not_a_classification() -> None:
    y = np.linspace(0, 1, 100)
    with pytest.raises(DataError, match=r"100 distinct values.*task: regression"):
        from_python((np.ones((100, 1)), y), task="classification")


def test_task_inference() -> None:
    from explore.datasets.target import infer_task

    assert infer_task(np.array([0.5, 1.0])) == "regression"
    assert infer_task(np.array([1.0, 2.0, 1.0])) == "classification"  # integral floats
    assert infer_task(np.array([True, False])) == "classification"
    assert infer_task(np.arange(500) % 10) == "classification"
    assert infer_task(np.arange(100)) == "regression"  # a count: each value once


# -- scikit-learn's tables -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["iris", "wine", "breast_cancer", "diabetes"])
def test_scikit_learns_tables_are_read_without_importing_it(name: str) -> None:
    code = (f"import sys; from explore import datasets; d = datasets.get({name!r}); "
            "x = d.load(); print(d.features, len(x.train) + len(x.valid) + len(x.test), "
            "'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    features, rows, imported = out.stdout.split()
    assert imported == "False", out.stderr
    sklearn = pytest.importorskip("sklearn.datasets", reason="in the dev extra")
    theirs = getattr(sklearn, f"load_{name}")(**({"scaled": False} if name == "diabetes"
                                                  else {}))
    assert (int(rows), int(features)) == theirs.data.shape
    ds = datasets.get(name).configure()
    assert ds.features == datasets.get(name).features and ds.valid == datasets.get(name).valid
    assert ds.preprocess is not None and ds.preprocess.numeric == tuple(theirs.feature_names)
    # the training rows are theirs, standardized
    train, _, _ = split_rows(len(theirs.target), 0.2, 0.2, seed=0,
                             classes=None if name == "diabetes" else theirs.target)
    t = theirs.data[train]
    np.testing.assert_allclose(ds.load().train.x, (t - t.mean(0)) / t.std(0), atol=1e-5)


def test_scikit_learns_tables_take_table_options() -> None:
    data = bind(parse_space({"dataset": {"name": "iris", "valid": 0.5, "test": 0.0,
                                         "scale": "minmax"},
                             "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})).data
    assert data.valid == 75 and data.preprocess is not None
    assert data.preprocess.scaling == "minmax"
    with pytest.raises(SpaceError, match=r"dataset\.scale: .*fixed splits"):
        bind(parse_space({"dataset": {"name": "digits", "scale": "minmax"},
                          "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}}))


# -- the search space ------------------------------------------------------------------------


def test_paths_are_relative_to_the_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    (tmp_path / "data").mkdir()
    churn().to_csv(tmp_path / "data" / "churn.csv", index=False)
    churn(30, seed=1).to_csv(tmp_path / "data" / "valid.csv", index=False)
    f = tmp_path / "spaces" / "s.yaml"
    f.parent.mkdir()
    f.write_text("dataset:\n  path: ../data/churn.csv\n  target: churned\n"
                 "  categorical: [plan]\n  valid: ../data/valid.csv\n" + BUDGET)
    monkeypatch.chdir("/")  # not where the file is
    space = load_space(f)
    assert space.dataset is not None and space.dataset.path == f.parent / "../data/churn.csv"
    data = bind(space).data
    assert data.valid == 30 and getattr(data, "rows", None) == (60, 30, 0)
    # a dict space resolves against the current directory
    monkeypatch.chdir(tmp_path / "data")
    s = parse_space({"dataset": {"path": "churn.csv", "target": "churned",
                                 "categorical": ["plan"]},
                     "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})
    assert s.dataset is not None and s.dataset.path == tmp_path / "data" / "churn.csv"


SCHEMA_BAD = {
    "two sources": ("dataset: {name: iris, path: d.csv}\n", 1, "dataset", "exactly one of"),
    "no source": ("dataset: {target: t}\n", 1, "dataset", "exactly one of"),
    "x alone": ("dataset: {x: X.npy}\n", 1, "dataset", "x and y go together"),
    "bad fraction": ("dataset:\n  path: d.csv\n  target: t\n  valid: 1.5\n", 4,
                     "dataset.valid", "fraction in (0, 1)"),
    "bad scale": ("dataset:\n  path: d.csv\n  target: t\n  scale: log\n", 4, "dataset.scale",
                  "'none', 'standard' or 'minmax'"),
    "target for a name": ("dataset: {name: iris, target: t}\n", 1, "dataset",
                          "target is for a table file"),
    "no target": ("dataset: {path: d.csv}\n", 1, "dataset", "target: name the column"),
    "missing file": ("dataset:\n  path: gone.csv\n  target: t\n", 2, "dataset.path",
                     "no such file"),
    "missing column": ("dataset:\n  path: d.csv\n  target: nope\n", 3, "dataset.target",
                       "no column 'nope'; columns: a, t"),
    "no dataset": ("", 1, "dataset", "Field required"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_BAD))
def test_dataset_errors_have_file_line_and_key(case: str, tmp_path: Path) -> None:
    text, line, key, words = SCHEMA_BAD[case]
    pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "t": [0, 1, 0, 1]}).to_csv(tmp_path / "d.csv",
                                                                        index=False)
    f = tmp_path / "s.yaml"
    f.write_text(text + BUDGET)
    with pytest.raises(SpaceError) as e:
        bind(load_space(f))  # the schema's errors when read, the data's when bound
    msg = str(e.value)
    assert f"{f}:{line}: {key}: " in msg and words in msg, msg


def test_a_space_binds_data_from_python_and_compiles_against_it() -> None:
    from explore.candidate import compile_candidate
    from explore.sampling import fixed

    space = parse_space({"budget": {"trials": 1, "rounds": 1, "memory": "64MB"},
                         "model": {"depth": 1, "width": 8}, "training": {"batch_size": 8}})
    with pytest.raises(SpaceError, match="names no dataset"):
        bind(space)
    ds = from_python(churn(90), "churned", categorical=["plan"])
    bound = bind(space, ds)
    assert bound.data is ds and bound.space is space
    cand = compile_candidate(bound, fixed(space), share=8_000_000)
    prog = cand.program
    assert prog.buffers[prog.params[0].buffer].shape == (8, 5)  # [out, in]: 2 numeric + 3 one-hot
    assert cand.program.batch_size == 18  # validates the split's 18 rows in one chunk
    with pytest.raises(TypeError, match="bound to a dataset"):
        bind(space, churn(90))  # a frame is made a dataset by from_python


def test_reading_a_space_reads_no_data_and_imports_no_code(tmp_path: Path) -> None:
    """The schema is data: a data file and a builder module are read when the space is
    bound (once per run), and what is wrong with them is said at their line there."""
    f = tmp_path / "s.yaml"
    f.write_text("dataset:\n  path: rows.csv\n  target: t\n  categorical: [plan]\nmodel:\n"
                 "  builder: not_yet_written:build\n" + BUDGET)
    (tmp_path / "rows.csv").write_text("a,t\n1,0\n")
    space = load_space(f)  # neither the table nor the module is touched
    assert space.dataset is not None and space.model.builder == "not_yet_written:build"
    (tmp_path / "rows.csv").unlink()
    with pytest.raises(SpaceError, match=rf"{f}:2: dataset.path: .*no such file"):
        bind(space)
    churn(40).to_csv(tmp_path / "rows.csv", index=False)
    f.write_text(f.read_text().replace("target: t", "target: churned"))
    with pytest.raises(SpaceError, match=rf"{f}:6: model.builder: cannot import"):
        bind(load_space(f))
    (tmp_path / "not_yet_written.py").write_text("def build(trial):\n    return None\n")
    bound = bind(load_space(f))
    assert bound.uses_builder and bound.builder is not None and bound.builder.__name__ == "build"


@pytest.mark.parametrize("column", ["bool", "boolean", "uint64"])
def test_a_boolean_or_uint64_categorical_column_is_one_hot_encoded(column: str) -> None:
    """Its categories are integers (False, True as 0, 1; 2**63 whole): every row is one of
    them, in training and in a prediction's features, none all zeros."""
    rng = np.random.default_rng(0)
    k = rng.random(60) > 0.5
    values = {"bool": k, "boolean": pd.array(k, dtype="boolean"),
              "uint64": np.where(k, np.uint64(2**63), np.uint64(5))}[column]
    frame = pd.DataFrame({"a": rng.normal(size=60), "k": values, "y": np.where(k, "p", "q")})
    ds = from_python(frame, "y", categorical=["k"])
    assert ds.preprocess.categories == (((5, 2**63),) if column == "uint64" else ((0, 1),))
    onehot = ds.preprocess.transform(frame)[:, 1:]
    assert (onehot.sum(1) == 1).all() and (onehot[:, 1] == k).all()


@pytest.mark.parametrize(("labels", "says"), [
    (np.array([b"no", b"yes"] * 20), "the target y is |S3"),
    (np.array([datetime.date(2020, 1, 1 + i % 2) for i in range(40)], dtype=object),
     "a value of type date (datetime.date(2020, 1, 1), row 0)"),
    (np.array([decimal.Decimal(i % 2) for i in range(40)], dtype=object),
     "a value of type Decimal"),
    (np.array(["a" if i % 2 else 1 for i in range(40)], dtype=object),
     "mixes text ('a', row 1) and numbers (1, row 0)"),
])
def test_labels_a_study_cannot_store_or_give_back_are_refused(labels: np.ndarray,
                                                              says: str) -> None:
    """Bytes, dates and Decimals cannot be stored with the study (the run failed after
    creating it), and text mixed with numbers came back from predict as text."""
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    with pytest.raises(DataError, match=re.escape(says)):
        from_python((x, labels))


def test_a_constant_regression_target_and_a_single_name_given_as_text() -> None:
    """A target of one value has nothing to learn (every trial's r2 was NaN); a column's
    name given as a string is that column, not its letters."""
    x = np.random.default_rng(0).normal(size=(40, 2))
    frame = pd.DataFrame({"ab": x[:, 0], "c": x[:, 1], "y": np.full(40, 5.0)})
    with pytest.raises(DataError, match=r"the target 'y' is 5\.0 in every row"):
        from_python(frame, "y", task="regression")
    frame["y"] = np.arange(40.0)
    ds = from_python(frame, "y", task="regression", features="ab")
    assert ds.preprocess.columns == ("ab",)
