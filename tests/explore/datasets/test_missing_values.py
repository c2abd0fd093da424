"""Missing values in a table (``dataset.missing``): refused in one message naming every
column, its count and its rows (index labels; a CSV's lines), dropped, or imputed from
the training split only; the imputation stored with the preprocessing, applied to rows
predicted later and inside the exported ONNX graph; infinities always refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import explore
from explore.binding import bind
from explore.datasets import DataError, Preprocess, from_file, from_python
from explore.datasets.missing import csv_lines
from explore.datasets.split import split_rows
from explore.runner import RunRefused
from explore.space import load_space, parse_space
from explore.yamlio import SpaceError

BUDGET = {"trials": 1, "rounds": 1, "memory": "64MB"}


def table(n: int = 60, seed: int = 0) -> pd.DataFrame:
    """Two numeric columns, a text and an integer category, a 0/1 target; no gaps."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "age": rng.integers(18, 80, n).astype(float),
        "spend": rng.normal(50.0, 10.0, n),
        "plan": rng.choice(["basic", "pro", "team"], n),
        "zone": rng.choice([1, 2, 3], n),
        "churned": np.tile([0, 0, 1], n // 3 + 1)[:n],
    })


def holed() -> pd.DataFrame:
    """:func:`table` with gaps in every kind of column, the target's too."""
    frame = table()
    frame.loc[[3, 7, 9, 11, 13, 15, 40], "age"] = np.nan
    frame.loc[4, "spend"] = np.nan
    frame.loc[[5, 6], "plan"] = None
    frame["zone"] = frame["zone"].astype(float)  # as pandas reads integers with a gap
    frame.loc[8, "zone"] = np.nan
    frame["churned"] = frame["churned"].astype(float)
    frame.loc[10, "churned"] = np.nan
    return frame


CATS = ["plan", "zone"]


# -- error: every problem in one message --------------------------------------------------------


def test_one_message_names_every_column_with_its_count_labels_and_csv_lines(
        tmp_path: Path) -> None:
    holed().to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError) as e:
        from_file(tmp_path / "d.csv", "churned", categorical=CATS)
    msg = str(e.value)
    assert e.value.key == "missing"
    assert "d.csv: missing values in 5 columns (12 of 60 rows):" in msg
    # 0-based index labels as pandas shows them; the file's lines (header: line 1)
    assert "'age': 7 missing, at index 3, 7, 9, 11, 13, ... (lines 5, 9, 11, 13, 15, ...)" \
        in msg
    assert "'spend': 1 missing, at index 4 (line 6)" in msg
    assert "'plan': 2 missing, at index 5, 6 (lines 7, 8)" in msg
    assert "'zone': 1 missing, at index 8 (line 10)" in msg
    assert "target 'churned': 1 missing, at index 10 (line 12)" in msg
    assert "dataset.missing: drop" in msg and "impute" in msg


def test_a_dataframe_gives_its_own_index_labels_and_arrays_their_rows() -> None:
    frame = holed()
    frame.index = [f"c{i}" for i in range(len(frame))]
    with pytest.raises(DataError) as e:
        from_python(frame, "churned", categorical=CATS)
    msg = str(e.value)
    assert "'spend': 1 missing, at index c4\n" in msg and "line" not in msg
    assert "target 'churned': 1 missing, at index c10\n" in msg
    x = np.ones((10, 3))
    x[[2, 5], 1] = np.nan
    y = np.arange(10.0)
    y[0] = np.nan
    with pytest.raises(DataError) as e:
        from_python((x, y))
    assert "'x1': 2 missing, at rows 2, 5\n" in str(e.value)
    assert "target y: 1 missing, at row 0\n" in str(e.value)


def test_a_split_of_its_own_is_reported_in_the_same_message(tmp_path: Path) -> None:
    main, valid = holed(), table(30, seed=1)
    valid.loc[2, "spend"] = np.nan
    main.to_csv(tmp_path / "d.csv", index=False)
    valid.to_csv(tmp_path / "v.csv", index=False)
    with pytest.raises(DataError) as e:
        from_file(tmp_path / "d.csv", "churned", categorical=CATS, valid=tmp_path / "v.csv")
    msg = str(e.value)
    assert "d.csv: missing values in 5 columns" in msg
    assert "v.csv: missing values in 1 column (1 of 30 rows):\n  'spend': 1 missing, at " \
        "index 2 (line 4)" in msg


def test_csv_lines_skip_blank_lines_and_follow_quoted_newlines(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text('a,b\n1,"two\nlines"\n\n\n,3\n4,5\n')
    assert pd.read_csv(f)["a"].isna().tolist() == [False, True, False]
    assert csv_lines(f, [0, 1, 2]) == {0: 2, 1: 6, 2: 7}


@pytest.mark.parametrize("missing", ["error", "drop", "impute"])
def test_infinities_are_refused_whatever_missing_says(missing: str) -> None:
    frame = table()
    frame.loc[[2, 9], "spend"] = [np.inf, -np.inf]
    frame["churned"] = frame["churned"].astype(float)
    frame.loc[1, "churned"] = np.inf
    with pytest.raises(DataError) as e:
        from_python(frame, "churned", categorical=CATS, missing=missing)
    msg = str(e.value)
    assert "the data: infinite (in float32) values in 2 columns:" in msg
    assert "'spend': 2 infinite, at index 2, 9" in msg
    assert "target 'churned': 1 infinite, at index 1" in msg
    assert "replace them with NaN" in msg and e.value.key is None


def test_values_beyond_float32_are_refused_as_infinite() -> None:
    """1e39 and 1e300 are finite in float64 but infinite in float32, where the models
    train: refused as infinities are, not left to overflow into a trial's NaN."""
    frame = table()
    frame["spend"] = frame["spend"].astype(float)
    frame.loc[4, "spend"] = 1e300
    frame["churned"] = frame["churned"].astype(float)
    frame.loc[7, "churned"] = -1e39
    frame.loc[8, "churned"] = 3e38  # float32 holds it
    with pytest.raises(DataError) as e:
        from_python(frame, "churned", categorical=CATS, task="regression")
    msg = str(e.value)
    assert "'spend': 1 infinite, at index 4" in msg
    assert "target 'churned': 1 infinite, at index 7" in msg and "+-3.4e38" in msg


# -- drop ------------------------------------------------------------------------------------


def test_drop_drops_rows_with_a_missing_feature_or_target_before_the_split() -> None:
    frame = holed()
    ds = from_python(frame, "churned", categorical=CATS, missing="drop", valid=0.25)
    assert sum(ds.rows) == 60 - 12
    assert str(ds.missing_report) == "dropped 12 of 60 rows with a missing value"
    assert ds.missing_report.to_dict()["dropped"] == 12
    p = ds.preprocess
    assert p is not None and p.impute is None and p.fill == ()
    # integers pandas read as floats for a gap stay integers: labels and categories
    assert p.labels == (0, 1) and p.categories[1] == (1, 2, 3)
    data = ds.load()
    assert np.isfinite(data.train.x).all() and np.isfinite(data.valid.x).all()
    clean = frame.dropna()
    assert len(data.train) + len(data.valid) == len(clean)
    # the rows kept, transformed: every one of them is a complete row of the table
    every = p.transform(clean)
    for row in np.concatenate([data.train.x, data.valid.x]):
        assert np.isclose(every, row).all(1).any()


def test_a_table_with_a_gap_in_every_row_is_refused_with_drop() -> None:
    frame = table(12)
    frame["age"] = np.nan
    with pytest.raises(DataError, match=r"every one of its 12 rows has a missing value"):
        from_python(frame, "churned", categorical=CATS, missing="drop")


# -- impute: fitted on the training split only ---------------------------------------------


def skewed(n: int = 80) -> pd.DataFrame:
    """A regression table whose training split's statistics differ from the whole
    table's: the values of the rows that go to validation are far off."""
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"a": rng.integers(0, 5, n).astype(float),
                          "b": rng.normal(size=n),
                          "kind": rng.choice(["u", "v", "w"], n, p=[0.5, 0.3, 0.2]),
                          "y": rng.normal(size=n) * 3.7})
    train, valid, _ = split_rows(n, 0.25, 0.0, seed=0)
    frame.loc[valid, "a"] = 1000.0
    frame.loc[valid, "kind"] = "w"
    frame.loc[[train[0], train[1], valid[0]], "a"] = np.nan
    frame.loc[[train[2], valid[1]], "kind"] = None
    return frame


@pytest.mark.parametrize("how", ["mean", "median", "most_frequent"])
def test_impute_fills_with_the_training_splits_statistic(how: str) -> None:
    frame = skewed()
    ds = from_python(frame, "y", categorical=["kind"], valid=0.25, missing="impute",
                     impute=how, task="regression")
    train, _, _ = split_rows(len(frame), 0.25, 0.0, seed=0)
    a = frame["a"].to_numpy()[train]
    a = a[~np.isnan(a)]
    values, counts = np.unique(a, return_counts=True)
    want = {"mean": a.mean(), "median": np.median(a),
            "most_frequent": values[np.argmax(counts)]}[how]
    whole = frame["a"].dropna()
    whole_stat = {"mean": whole.mean(), "median": whole.median(),
                  "most_frequent": whole.mode()[0]}[how]
    p = ds.preprocess
    assert p is not None and p.impute == how
    assert p.fill[0] == pytest.approx(want) and p.fill[0] != pytest.approx(whole_stat)
    # the category: the training rows' most frequent ("u"), not the table's ("w")
    kinds = frame["kind"].iloc[train].value_counts()
    assert p.fill_categories == (kinds.idxmax(),) == ("u",)
    assert frame["kind"].value_counts().idxmax() == "w"
    # scaling is fitted on the imputed training values (impute, then scale)
    filled = frame["a"].to_numpy()[np.sort(train)]
    filled[np.isnan(filled)] = p.fill[0]
    assert p.offset[0] == pytest.approx(filled.mean())
    data = ds.load()
    assert np.isfinite(data.train.x).all() and np.isfinite(data.valid.x).all()
    np.testing.assert_array_equal(data.valid.x, p.transform(frame.iloc[split_rows(
        len(frame), 0.25, 0.0, seed=0)[1]]))
    report = ds.missing_report
    assert report.imputed == {"a": 3, "kind": 2} and report.dropped == 0
    assert f"imputed 5 values: 'a' 3 ({how.replace('_', ' ')} {p.fill[0]:.6g})" in str(report)


def test_impute_never_imputes_a_target_it_drops_the_row() -> None:
    frame = holed()
    ds = from_python(frame, "churned", categorical=CATS, missing="impute")
    assert sum(ds.rows) == 59
    report = ds.missing_report
    # the row without a target (index 10) had no feature gap: 11 values filled
    assert report.dropped == 1 and sum(report.imputed.values()) == 11
    assert str(report).startswith("dropped 1 of 60 rows without a target; imputed 11 values")
    assert np.isfinite(ds.load().train.x).all()


def test_a_column_without_a_value_in_training_is_refused() -> None:
    frame = skewed()
    train, _, _ = split_rows(len(frame), 0.25, 0.0, seed=0)
    frame.loc[train, "b"] = np.nan
    with pytest.raises(DataError, match=r"the column 'b' has no value in the training "
                                        r"split to impute from"):
        from_python(frame, "y", categorical=["kind"], valid=0.25, missing="impute",
                    task="regression")


def test_a_split_of_its_own_is_imputed_with_the_training_values(tmp_path: Path) -> None:
    main, valid = table(), table(30, seed=1)
    main.loc[3, "spend"] = np.nan
    valid.loc[[0, 4], "spend"] = np.nan
    valid.loc[2, "plan"] = None
    ds = from_python(main, "churned", categorical=["plan"], valid=valid, missing="impute")
    p = ds.preprocess
    assert p is not None
    out = ds.load().valid.x
    assert np.isfinite(out).all()
    spend = p.numeric.index("spend")
    want = (p.fill[spend] - p.offset[spend]) / p.scale[spend]
    assert np.isclose(out[:, spend], want).sum() == 2  # (the split's rows are shuffled)
    assert ds.missing_report.imputed == {"spend": 3, "plan": 1}


def test_the_imputation_is_stored_and_applied_to_rows_predicted_later() -> None:
    ds = from_python(holed(), "churned", categorical=CATS, missing="impute", impute="mean")
    p = ds.preprocess
    assert p is not None
    again = Preprocess.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and again.fill == p.fill and again.fill_categories == p.fill_categories
    rows = pd.DataFrame({"age": [np.nan, 30.0], "spend": [40.0, None],
                         "plan": [None, ""], "zone": [np.nan, 2.0]})
    full = rows.copy()
    full["age"] = full["age"].fillna(p.fill[0])
    full["spend"] = full["spend"].fillna(p.fill[1])
    full["plan"] = p.fill_categories[0]  # None and "" (not a category) are missing
    full["zone"] = full["zone"].fillna(p.fill_categories[1])
    np.testing.assert_array_equal(again.transform(rows), again.transform(full))
    # before, a stored preprocessing had no fill: it reads as nothing imputed
    old = {k: v for k, v in p.to_dict().items() if k not in ("impute", "fill",
                                                             "fill_categories")}
    assert Preprocess.from_dict(old).fill == () and Preprocess.from_dict(old).impute is None


@pytest.mark.parametrize("cats", [("basic", "pro"), ("", "basic", "pro")])
def test_the_onnx_preprocessing_imputes_as_transform_does(cats: tuple[str, ...]) -> None:
    """NaN in ``x`` takes its column's value before scaling; "" in a text input is its
    most frequent category (unless "" is a category of its own, as in the search)."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from explore.onnx_model import ML_OPSET, OPSET, preprocessing_nodes

    p = Preprocess(columns=("a", "b", "plan", "zone"), numeric=("a", "b"),
                   offset=(1.0, 2.0), scale=(2.0, 4.0), categorical=("plan", "zone"),
                   categories=(cats, (1, 2, 3)), impute="median", fill=(5.0, -1.0),
                   fill_categories=("pro", 2))
    nodes, inits, inputs = preprocessing_nodes(p, "features", helper, numpy_helper,
                                               TensorProto)
    out = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", p.features])
    model = helper.make_model(helper.make_graph(nodes, "pre", inputs, [out], inits),
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid("ai.onnx.ml", ML_OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    rows = pd.DataFrame({"a": [np.nan, 3.0, 0.0, np.nan], "b": [1.0, np.nan, np.nan, 2.0],
                         "plan": ["", "pro", "gold", "basic"], "zone": [1, 3, 2, 1]})
    (got,) = ort.InferenceSession(model.SerializeToString()).run(None, {
        "x": rows[["a", "b"]].to_numpy(np.float32),
        "plan": rows[["plan"]].to_numpy().astype(object),
        "zone": rows[["zone"]].to_numpy(np.int64)})
    want = p.transform(rows)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    plan = want[0, 2:2 + len(cats)]
    assert plan[cats.index("" if "" in cats else "pro")] == 1 and plan.sum() == 1
    assert want[0, 0] == (5.0 - 1.0) / 2.0 and want[2, 2:2 + len(cats)].sum() == 0


# -- the search space ----------------------------------------------------------------------------


def test_the_dataset_section_takes_missing_and_impute(tmp_path: Path) -> None:
    holed().to_csv(tmp_path / "d.csv", index=False)
    f = tmp_path / "s.yaml"
    f.write_text("dataset: {path: d.csv, target: churned, categorical: [plan, zone],\n"
                 "          missing: impute, impute: most_frequent}\n"
                 "budget: {trials: 1, rounds: 1, memory: 64MB}\n")
    ds = bind(load_space(f)).data
    assert ds.preprocess is not None and ds.preprocess.impute == "most_frequent"
    f.write_text("dataset: {path: d.csv, target: churned, categorical: [plan, zone]}\n"
                 "budget: {trials: 1, rounds: 1, memory: 64MB}\n")
    with pytest.raises(SpaceError) as e:
        bind(load_space(f))
    [err] = e.value.errors
    assert err.key == "dataset.missing" and err.line == 1
    assert "missing values in 5 columns" in err.message


@pytest.mark.parametrize(("section", "key", "says"), [
    ({"path": "d.csv", "target": "y", "impute": "mean"}, "dataset.impute",
     "set missing: impute as well"),
    ({"name": "iris", "missing": "drop"}, "dataset.missing", "a named dataset has no"),
    ({"path": "d.csv", "target": "y", "missing": "fill"}, "dataset.missing", "'drop'"),
    ({"path": "d.csv", "target": "y", "missing": "impute", "impute": "mode"},
     "dataset.impute", "'most_frequent'"),
])
def test_bad_missing_options_are_refused_at_their_key(section: dict[str, object], key: str,
                                                      says: str) -> None:
    with pytest.raises(SpaceError) as e:
        parse_space({"dataset": section, "budget": BUDGET})
    [err] = e.value.errors
    assert err.key == key and says in err.message, str(err)


def test_bad_options_from_python_are_refused() -> None:
    with pytest.raises(DataError, match=r"missing 'fill': one of error, drop, impute"):
        from_python(table(), "churned", missing="fill")
    with pytest.raises(DataError, match=r"impute 'mode': one of mean, median, most_freq"):
        from_python(table(), "churned", missing="impute", impute="mode")


# -- a run: explore.run, the kept model, its ONNX export ---------------------------------------


def test_a_run_with_missing_values_predicts_and_exports_them(tmp_path: Path) -> None:
    """A CSV with gaps searched with missing: impute; the kept model, loaded again,
    imputes the rows it predicts as training did, and its ONNX export (NaN in ``x``,
    "" for a category) gives the same probabilities and labels."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    frame = holed().drop(columns=["zone"])
    frame.to_csv(tmp_path / "d.csv", index=False)
    space = tmp_path / "gaps.yaml"
    space.write_text(
        "dataset: {path: d.csv, target: churned, categorical: [plan], missing: impute}\n"
        "objectives: [{metric: accuracy}]\n"
        "budget: {trials: 2, rounds: 2, memory: 400MB, workers: 1}\n"
        "sampler: {name: random, seed: 0}\npruner: none\n"
        "model: {depth: 1, width: 8}\ntraining: {lr: 0.05, batch_size: 16}\n"
        "keep_models: 1\n")
    study = explore.run(space)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    model = explore.load_model(tmp_path / "gaps.db", "gaps")
    pre = model.data.preprocess
    assert pre is not None and pre.impute == "median" and len(pre.fill) == 2
    rows = frame.drop(columns=["churned"]).iloc[:20]
    assert rows.isna().any(axis=None)
    full = rows.fillna({"age": pre.fill[0], "spend": pre.fill[1],
                        "plan": pre.fill_categories[0]})
    np.testing.assert_array_equal(model.predict_proba(rows), model.predict_proba(full))
    sess = ort.InferenceSession(model.to_onnx().SerializeToString())
    feeds = {"x": rows[["age", "spend"]].to_numpy(np.float32),
             "plan": rows[["plan"]].fillna("").to_numpy().astype(object)}
    probs, labels = sess.run(["probabilities", "label"], feeds)
    np.testing.assert_allclose(probs, model.predict_proba(rows), rtol=1e-4, atol=1e-6)
    assert list(labels) == list(model.predict(rows))
    assert set(labels) <= {0, 1}  # the target's integers, though pandas read floats


def test_a_dataframe_with_gaps_is_refused_by_explore_run_in_one_message(
        tmp_path: Path) -> None:
    space = {"name": "gaps", "dataset": {"categorical": CATS},
             "budget": {"trials": 2, "rounds": 2, "memory": "400MB"}, "keep_models": 0}
    with pytest.raises(RunRefused) as e:
        explore.run(space, data=holed(), target="churned",
                    storage=f"sqlite:///{tmp_path / 'r.db'}")
    msg = str(e.value)
    assert "the data: missing values in 5 columns" in msg and "dataset.missing" in msg
    assert not (tmp_path / "r.db").exists()


def test_a_dataframe_with_gaps_is_searched_with_missing_drop(tmp_path: Path) -> None:
    space = {"name": "gaps", "dataset": {"categorical": CATS, "missing": "drop"},
             "objectives": [{"metric": "accuracy"}],
             "budget": {"trials": 2, "rounds": 2, "memory": "400MB", "workers": 1},
             "keep_models": 0}
    study = explore.run(space, data=holed(), target="churned",
                        storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
