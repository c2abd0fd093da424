"""Users' own data: tables (CSV, Parquet, a pandas DataFrame) and arrays (``.npz``,
``.npy`` pairs, numpy arrays), split, preprocessed and checked.

A :class:`TableDataset` reads its data once when it is made, checks it (a clear
:class:`DataError` naming the file, column and row at fault), splits it (stratified
for classification, reproducible from ``seed``) and fits a :class:`Preprocess` on the
training split only: numeric features scaled (``standard``, ``minmax`` or ``none``),
categorical ones one-hot encoded with the categories seen in training.  It then keeps
only what it learned (the preprocessing, the counts) and reads the data again when the
run loads it (:meth:`TableDataset.load_compact`), transforming a chunk of rows at a
time straight into the run's shared arrays, so the scheduler never holds the table
for the length of a run.  ``.npy`` features are memory-mapped.

>>> import pandas as pd
>>> frame = pd.DataFrame({"age": [20, 30, 40, 50, 60, 70, 25, 35, 45, 55],
...                       "plan": ["a", "b"] * 5, "churned": [0, 1] * 5})
>>> ds = from_python(frame, target="churned", categorical=["plan"], valid=0.2, test=0.0)
>>> ds.task, ds.classes, ds.features, ds.valid
('classification', 2, 3, 2)
>>> ds.preprocess.feature_names
('age', 'plan=a', 'plan=b')
>>> data = ds.load()
>>> len(data.train), data.train.x.dtype, data.train.y.dtype
(8, dtype('float32'), dtype('int64'))

Task inference, when ``task`` is not given: a float target with a non-integral value
is a regression; a boolean, text or categorical target is a classification; an
integer target (or a float one whose values are all integral) is a classification
unless it has more than 20 distinct values that are more than 10% of the rows (few
samples per value: a count or an amount), which makes it a regression.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from explore.datasets._base import (
    TASKS,
    BaseDataset,
    Dataset,
    Empty,
    Split,
    plain_empty,
)
from explore.datasets.errors import DataError
from explore.datasets.preprocess import Preprocess, _is_frame, _pd, _plain

if TYPE_CHECKING:
    import pandas as pd

SCALES = ("none", "standard", "minmax")
FORMATS = (".csv", ".parquet", ".npz", ".npy")
CHUNK_BYTES = 4 << 20  # rows read and converted at a time: about this many float64 bytes
MANY_VALUES = 20  # a target with more distinct values than this may be a regression
# search_spaces/README.md, "Limits": checked before anything is allocated
MAX_NPZ_BYTES = 2 << 30  # an .npz's arrays, decompressed (read into memory whole)
MAX_FEATURES = 100_000  # columns of a table, features of arrays, after one-hot encoding
MAX_CATEGORIES = 10_000  # categories of one categorical column

__all__ = ["FORMATS", "SCALES", "DataSection", "Preprocess", "TableDataset", "from_file",
           "from_python", "infer_task", "resolve", "split_rows"]


# -- sources: what was read, before it is checked --------------------------------------------


@dataclass
class _Source:
    """One table as read: a DataFrame, or a features array ``x`` and its target ``y``."""

    where: str  # for messages: the file, or "the DataFrame"
    frame: pd.DataFrame | None = None
    x: np.ndarray | None = None  # [n, ...] numeric (possibly memory-mapped)
    y: np.ndarray | None = None
    names: list[str] | None = None  # of x's columns (default x0, x1, ...)

    @property
    def n(self) -> int:
        if self.frame is not None:
            return len(self.frame)
        assert self.x is not None
        return len(self.x)


Table = Any  # a DataFrame, or a pair (features, target) of arrays or lists


def _source(data: Table, where: str) -> _Source:
    if isinstance(data, _Source):
        return data
    if _is_frame(data):
        return _Source(where, frame=data)
    if isinstance(data, tuple | list) and len(data) == 2:
        x = data[0] if isinstance(data[0], np.ndarray) else np.asarray(data[0])
        y = np.asarray(data[1])
        return _Source(where, x=x, y=y)
    raise DataError(f"{where}: expected a pandas DataFrame or a pair (X, y) of arrays, "
                    f"got {type(data).__name__}")


# -- splitting --------------------------------------------------------------------------------


def _count(frac: float, n: int) -> int:
    return 0 if frac <= 0 else max(1, round(frac * n))


def _allocate(want: int, room: np.ndarray, share: np.ndarray) -> np.ndarray | None:
    """``want`` rows over classes in proportion to ``share`` (largest remainders, ties
    to the first class), at most ``room`` each; None if they do not fit."""
    if want > room.sum():
        return None
    quota = want * share / share.sum()
    take = np.minimum(np.floor(quota).astype(np.int64), room)
    order = np.argsort(-(quota - np.floor(quota)), kind="stable")
    while take.sum() < want:
        for c in order:
            if take.sum() < want and take[c] < room[c]:
                take[c] += 1
    return take


def split_rows(n: int, valid: float, test: float, seed: int = 0,
               classes: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Row indices (train, valid, test) of ``n`` rows, each in a random order: ``valid``
    and ``test`` fractions of the rows (at least one each when above 0), stratified by
    ``classes`` (class index per row) when given, so that each class keeps its share in
    every split and at least one row in train.  The same arguments give the same split.

    >>> y = np.array([0] * 8 + [1] * 2)
    >>> tr, va, te = split_rows(10, 0.5, 0.0, seed=0, classes=y)
    >>> sorted(np.bincount(y[tr]).tolist()), np.bincount(y[va]).tolist()
    ([1, 4], [4, 1])
    """
    rng = np.random.default_rng(seed)
    n_valid, n_test = _count(valid, n), _count(test, n)
    if n - n_valid - n_test < 1:
        raise DataError(f"too few rows: {n} rows cannot give {n_valid} validation and "
                        f"{n_test} test rows and still leave one to train on")
    if classes is None:
        perm = rng.permutation(n)
        return perm[n_valid + n_test:], perm[:n_valid], perm[n_valid:n_valid + n_test]
    counts = np.bincount(classes)
    per = [rng.permutation(np.flatnonzero(classes == c)) for c in range(len(counts))]
    room = counts - 1  # every class keeps a row to train on
    parts: list[list[np.ndarray]] = [[], [], []]
    taken = np.zeros(len(counts), np.int64)
    for slot, want in ((1, n_valid), (2, n_test)):
        take = _allocate(want, room - taken, counts.astype(np.float64))
        if take is None:
            raise DataError(f"too few rows: {n} rows in {len(counts)} classes cannot give "
                            f"{n_valid} validation and {n_test} test rows while every class "
                            f"keeps a row in training")
        for c, k in enumerate(take):
            parts[slot].append(per[c][taken[c]:taken[c] + k])
        taken += take
    for c in range(len(counts)):
        parts[0].append(per[c][taken[c]:])
    return tuple(rng.permutation(np.concatenate(p)) if p else np.empty(0, np.int64)
                 for p in parts)


# -- task -------------------------------------------------------------------------------------


def _numeric(a: np.ndarray | pd.Series) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype.kind in "biuf"
    types = _pd().api.types
    return bool(types.is_numeric_dtype(a) or types.is_bool_dtype(a))


def infer_task(y: np.ndarray) -> str:
    """``classification`` or ``regression`` for target values ``y`` (the rule is in
    the module's docstring).

    >>> infer_task(np.array([0.5, 1.5])), infer_task(np.array(["a", "b"]))
    ('regression', 'classification')
    """
    y = np.asarray(y)
    if not _numeric(y) or y.dtype == bool:
        return "classification"
    if y.dtype.kind == "f" and not np.all(np.isfinite(y) & (np.mod(y, 1, where=np.isfinite(y),
                                                             out=np.zeros_like(y)) == 0)):
        return "regression"
    distinct = len(np.unique(y))
    return "regression" if distinct > MANY_VALUES and distinct > 0.1 * len(y) else \
        "classification"


def _sorted_unique(y: np.ndarray) -> np.ndarray:
    try:
        return np.unique(y)
    except TypeError:  # text mixed with numbers
        return np.unique(y.astype(str))


# -- the dataset --------------------------------------------------------------------------------


class DataSection(Protocol):
    """What :func:`resolve` reads: the search space's ``dataset:`` section
    (:class:`explore.space.Dataset`)."""

    @property
    def name(self) -> str | None: ...

    @property
    def path(self) -> Path | None: ...

    @property
    def x(self) -> Path | None: ...

    @property
    def y(self) -> Path | None: ...

    @property
    def target(self) -> str | None: ...

    @property
    def features(self) -> list[str] | None: ...

    @property
    def categorical(self) -> list[str]: ...

    @property
    def valid(self) -> int | float | Path | None: ...

    @property
    def test(self) -> float | Path | None: ...

    @property
    def scale(self) -> str | None: ...

    @property
    def task(self) -> str | None: ...

    @property
    def seed(self) -> int | None: ...


@dataclass
class _Layout:
    """Which columns are what, decided once from the main source."""

    target: str | None
    numeric: list[str]
    categorical: list[str]
    int_categories: dict[str, bool] = field(default_factory=dict)  # else text


class TableDataset(BaseDataset):
    """A table or arrays as a data set: read and checked when made (a
    :class:`DataError` otherwise), split, its :class:`Preprocess` fitted on the
    training split.

    ``data`` is a DataFrame (``target`` names a column; ``features`` the columns used,
    by default all others; ``categorical`` those one-hot encoded) or a pair ``(X, y)``
    of arrays (trailing axes of X are flattened; uint8 X with ``scale="none"`` stays
    uint8 with a ``pixel_scale`` of 1).  ``valid`` and ``test`` are fractions of the
    rows (stratified for a classification) or tables of their own; ``scale`` is
    ``standard`` (mean 0, std 1), ``minmax`` ([0, 1]) or ``none``; ``task`` is
    inferred when None (:func:`infer_task`); ``seed`` fixes the split.

    Attributes besides :class:`BaseDataset`'s: ``name``, ``rows`` (train, valid,
    test counts), ``preprocess``, ``target`` and ``where`` (the source, for messages).

    >>> ds = TableDataset((np.arange(20.0).reshape(10, 2), np.arange(10.0) / 3),
    ...                   valid=0.2, test=0.2, seed=1)
    >>> ds.task, ds.outputs, ds.rows, ds.preprocess.numeric
    ('regression', 1, (6, 2, 2), ('x0', 'x1'))
    """

    def __init__(self, data: Table, target: str | None = None, *,
                 features: Sequence[str] | None = None, categorical: Sequence[str] = (),
                 valid: float | Table = 0.2, test: float | Table = 0.0,
                 scale: str = "standard", task: str | None = None, seed: int = 0,
                 name: str = "table") -> None:
        def read() -> list[_Source | None]:
            return [_source(data, "the data"),
                    None if _is_fraction(valid) else _source(valid, "the validation data"),
                    None if _is_fraction(test) else _source(test, "the test data")]

        self._setup(read, target, features, categorical, valid, test, scale, task, seed,
                    name)

    @classmethod
    def _from_reader(cls, read: Callable[[], list[_Source | None]], target: str | None,
                     features: Sequence[str] | None, categorical: Sequence[str],
                     valid: float | Any, test: float | Any, scale: str, task: str | None,
                     seed: int, name: str) -> TableDataset:
        self = cls.__new__(cls)
        self._setup(read, target, features, categorical, valid, test, scale, task, seed,
                    name)
        return self

    # -- reading and checking, once --------------------------------------------------------

    def _setup(self, read: Callable[[], list[_Source | None]], target: str | None,
               features: Sequence[str] | None, categorical: Sequence[str], valid: Any,
               test: Any, scale: str, task: str | None, seed: int, name: str) -> None:
        if scale not in SCALES:
            raise DataError(f"scale {scale!r}: one of {', '.join(SCALES)}", key="scale")
        if task is not None and task not in TASKS:
            raise DataError(f"task {task!r}: one of {', '.join(TASKS)}", key="task")
        for opt, v in (("valid", valid), ("test", test)):
            if _is_fraction(v) and not (0 <= v < 1):
                raise DataError(f"{opt}: a fraction in [0, 1), got {v}", key=opt)
        if _is_fraction(valid) and valid <= 0:
            raise DataError("valid: the validation split needs rows (a fraction above 0)",
                            key="valid")
        self._read, self.name, self.seed = read, name, seed
        self._fractions = (valid if _is_fraction(valid) else 0.0,
                           test if _is_fraction(test) else 0.0)
        self.scaling = scale
        sources = read()
        main = sources[0]
        assert main is not None
        self.where = main.where
        for src, key in zip(sources, (None, "valid", "test"), strict=True):
            if src is not None:
                _has_rows(src, key)
        layout = self._layout(main, target, features, categorical)
        self._lay = layout
        for s in sources:
            if s is not None:
                self._check(s, layout)
        y_main = self._target(main)
        self.task = task or infer_task(y_main)
        self._check_target(main, y_main, layout)
        codes_main = None
        if self.task == "classification":
            every = _sorted_unique(y_main)
            codes_main = _class_codes(y_main, every)
            if len(every) < 2:
                raise DataError(f"{main.where}: the target {self._tname()} has one class "
                                f"({_plain(every[0])!r}): nothing to classify; is it the "
                                f"right column?", key="target")
        train, valid_rows, test_rows = split_rows(main.n, *self._fractions, seed=seed,
                                                  classes=codes_main)
        # the fitted transformation, from the training rows only
        self.target = layout.target
        categories = tuple(self._categories(main, c, train) for c in layout.categorical)
        for c, cats in zip(layout.categorical, categories, strict=True):
            if len(cats) > MAX_CATEGORIES:
                raise DataError(f"{main.where}: the categorical column {c!r} has "
                                f"{len(cats):,} categories in the training rows, more than "
                                f"the {MAX_CATEGORIES:,} a column may one-hot encode to; "
                                "is it an identifier? leave it out of the features",
                                key="categorical")
        width = len(layout.numeric) + sum(map(len, categories))
        if width > MAX_FEATURES:
            raise DataError(f"{main.where}: {width:,} features after one-hot encoding, "
                            f"more than the {MAX_FEATURES:,} a model's input may have",
                            key="categorical" if categories else "features")
        offset, spread = self._fit(main, train, layout, scale)
        labels: tuple[Any, ...] = ()
        target_scale = None
        y_train = y_main[train]
        if self.task == "classification":
            labels = tuple(_plain(v) for v in _sorted_unique(y_train))
            for s, rows in self._split_sources(sources, train, valid_rows, test_rows)[1:]:
                if s is None:
                    continue
                y = self._target(s)[rows] if rows is not None else self._target(s)
                unseen = sorted({_plain(v) for v in _sorted_unique(y)} - set(labels),
                                key=str)
                if unseen:
                    raise DataError(f"{s.where}: the target has {unseen[0]!r}, a class the "
                                    f"training split does not have; classes: "
                                    f"{', '.join(map(repr, labels))}", key="target")
        else:
            mean = float(np.mean(y_train, dtype=np.float64))
            std = float(np.std(y_train, dtype=np.float64)) or 1.0
            target_scale = (mean, std)
        columns = tuple(c for c in self._columns(main, layout))
        self.preprocess = Preprocess(
            columns=columns, numeric=tuple(layout.numeric), offset=offset, scale=spread,
            categorical=tuple(layout.categorical), categories=categories, task=self.task,
            labels=labels, target_scale=target_scale, scaling=scale)
        self.target_scale = target_scale
        self.classes = len(labels)
        self.features = self.preprocess.features
        counts = [len(train), len(valid_rows), len(test_rows)]
        for i, s in ((1, sources[1]), (2, sources[2])):
            if s is not None:
                counts[i] = s.n
        if counts[1] < 1:
            raise DataError("too few rows: the validation split is empty", key="valid")
        self.rows = (counts[0], counts[1], counts[2])
        self.valid = counts[1]
        x = main.x
        self.image = None
        self.pixel_scale = None
        if x is not None and x.dtype == np.uint8 and scale == "none":
            self.pixel_scale = 1.0  # kept as exact uint8 pixels
        if x is not None and x.ndim in (3, 4):
            self.image = (1, *x.shape[1:]) if x.ndim == 3 else (x.shape[1], x.shape[2], x.shape[3])

    def _tname(self) -> str:
        return repr(self._lay.target) if self._lay.target else "y"

    def _layout(self, s: _Source, target: str | None, features: Sequence[str] | None,
                categorical: Sequence[str]) -> _Layout:
        cats = list(categorical)
        if len(set(cats)) != len(cats):
            raise DataError(f"categorical lists a column twice: {_dupes(cats)}",
                            key="categorical")
        if features is not None:
            feats = list(features)
            if len(set(feats)) != len(feats):
                raise DataError(f"features lists a column twice: {_dupes(feats)}",
                                key="features")
        if s.frame is None:
            if target is not None or features is not None or cats:
                raise DataError(f"{s.where}: target, features and categorical name columns "
                                f"of a table; arrays have none", key="target")
            x, y = s.x, s.y
            assert x is not None and y is not None
            if x.ndim < 2:
                raise DataError(f"{s.where}: the features must be a 2-D array (rows, "
                                f"features), got shape {x.shape}", key="x")
            width = int(np.prod(x.shape[1:]))
            if width > MAX_FEATURES:
                raise DataError(f"{s.where}: {width:,} features per row, more than the "
                                f"{MAX_FEATURES:,} a model's input may have", key="x")
            if width == 0:
                raise DataError(f"{s.where}: the features array has shape {x.shape}: no "
                                f"features to learn from", key="x")
            if s.names is not None and len(s.names) == width:
                return _Layout(None, list(s.names), [])
            return _Layout(None, [f"x{i}" for i in range(width)], [])
        frame = s.frame
        names = [str(c) for c in frame.columns]
        if len(set(names)) != len(names):
            raise DataError(f"{s.where}: duplicate column names: {_dupes(names)}")
        if target is None:
            raise DataError(f"{s.where}: name the target column (target:); columns: "
                            f"{_listing(names)}", key="target")
        _need(s, [target], names, "target")
        if features is None:
            feats = [c for c in names if c != target]
        else:
            _need(s, feats, names, "features")
            if target in feats:
                raise DataError(f"the target {target!r} is also listed in features",
                                key="features")
        _need(s, cats, names, "categorical")
        if target in cats:
            raise DataError(f"the target {target!r} is also listed in categorical",
                            key="categorical")
        stray = [c for c in cats if c not in feats]
        if stray:
            raise DataError(f"categorical columns {_listing(stray)} are not among the "
                            f"features", key="categorical")
        if not feats:
            raise DataError(f"{s.where}: no feature columns besides the target {target!r}",
                            key="features")
        col = {str(c): c for c in frame.columns}
        for c in [*feats, target]:
            if frame[col[c]].dtype == object:
                _scalar_cells(s, c, frame[col[c]].to_numpy(),
                              "target" if c == target else "categorical")
        text = [c for c in feats if c not in cats and not _numeric(frame[col[c]])]
        if text:
            raise DataError(f"{s.where}: the columns {_listing(text)} are not numeric; "
                            f"list them under categorical (one-hot encoded) or leave them "
                            f"out of the features", key="categorical")
        types = _pd().api.types
        ints = {c: bool(types.is_integer_dtype(frame[col[c]]) or
                        types.is_bool_dtype(frame[col[c]])) for c in cats}
        return _Layout(target, [c for c in feats if c not in cats],
                       [c for c in feats if c in cats], ints)

    @staticmethod
    def _columns(s: _Source, layout: _Layout) -> list[str]:
        if s.frame is None:
            return layout.numeric
        keep = set(layout.numeric) | set(layout.categorical)
        return [str(c) for c in s.frame.columns if str(c) in keep]

    def _check(self, s: _Source, layout: _Layout) -> None:
        """Every value of every feature (and the target) is there and finite."""
        if s.frame is None:
            x, y = s.x, s.y
            assert x is not None and y is not None
            if y.ndim != 1:
                raise DataError(f"{s.where}: the target must be 1-D, got shape {y.shape}",
                                key="y")
            if len(x) != len(y):
                raise DataError(f"{s.where}: x has {len(x)} rows and y has {len(y)}; they "
                                f"must have one target per row", key="y")
            if int(np.prod(x.shape[1:])) != len(layout.numeric):
                raise DataError(f"{s.where}: {int(np.prod(x.shape[1:]))} features per row; "
                                f"the training data has {len(layout.numeric)}")
            if not _numeric(x):
                raise DataError(f"{s.where}: the features are {x.dtype}, not numbers", key="x")
            for start, block in _blocks(x):
                _finite(block.reshape(len(block), -1), start, s.where, layout.numeric)
            return
        frame = s.frame
        names = [str(c) for c in frame.columns]
        need = [*layout.numeric, *layout.categorical]
        if layout.target is not None:
            need.append(layout.target)
        _need(s, need, names, "features")
        col = {str(c): c for c in frame.columns}
        text = [c for c in layout.numeric if not _numeric(frame[col[c]])]
        if text:
            raise DataError(f"{s.where}: the columns {_listing(text)} are not numeric",
                            key="categorical")
        if layout.numeric:
            sub = frame[[col[c] for c in layout.numeric]]
            for start in range(0, len(frame), _chunk_rows(len(layout.numeric))):
                block = sub.iloc[start:start + _chunk_rows(len(layout.numeric))]
                _finite(block.to_numpy(np.float64), start, s.where, layout.numeric)
        for c in layout.categorical:
            missing = np.flatnonzero(frame[col[c]].isna().to_numpy())
            if len(missing):
                raise DataError(f"{s.where}: row {missing[0] + 1}, column {c!r}: a missing "
                                f"value", key="categorical")

    def _target(self, s: _Source) -> np.ndarray:
        if s.frame is None:
            assert s.y is not None
            return np.asarray(s.y)
        col = {str(c): c for c in s.frame.columns}
        assert self._lay.target is not None
        return s.frame[col[self._lay.target]].to_numpy()

    def _check_target(self, s: _Source, y: np.ndarray, layout: _Layout) -> None:
        name = self._tname()
        if y.dtype.kind in "cmMV":  # complex, times, raw bytes: neither numbers nor labels
            raise DataError(f"{s.where}: the target {name} is {y.dtype}: a target is real "
                            f"numbers or class labels", key="target")
        numeric = _numeric(y) and y.dtype != object
        if numeric and y.dtype.kind in "fc":
            bad = np.flatnonzero(~np.isfinite(y))
            if len(bad):
                raise DataError(f"{s.where}: row {bad[0] + 1}, target {name}: "
                                f"{_plain(y[bad[0]])} (values must be finite)", key="target")
        elif not numeric:
            missing = np.flatnonzero(_pd().isna(y))
            if len(missing):
                raise DataError(f"{s.where}: row {missing[0] + 1}, target {name}: a missing "
                                f"value", key="target")
        if self.task == "regression" and not (numeric and y.dtype != bool):
            raise DataError(f"{s.where}: the target {name} is {y.dtype} ("
                            f"{_plain(y[0])!r}, ...), not numbers: a regression needs a "
                            f"numeric target", key="task")
        if self.task == "classification" and numeric and y.dtype.kind == "f":
            distinct = len(np.unique(y))
            if distinct > MANY_VALUES and distinct > 0.5 * len(y):
                raise DataError(f"{s.where}: the target {name} has {distinct} distinct values "
                                f"in {len(y)} rows, too many for classes; use task: "
                                f"regression", key="task")

    def _categories(self, s: _Source, column: str, train: np.ndarray) -> tuple[Any, ...]:
        assert s.frame is not None
        values = s.frame[{str(c): c for c in s.frame.columns}[column]].to_numpy()[train]
        if self._lay.int_categories.get(column):
            return tuple(int(v) for v in np.unique(values.astype(np.int64)))
        return tuple(str(v) for v in np.unique(values.astype(str)))

    def _fit(self, s: _Source, train: np.ndarray, layout: _Layout,
             scale: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(offset, scale) per numeric feature over the training rows, a chunk at a time
        (one chunk for a table that small: numpy's own mean and std)."""
        k = len(layout.numeric)
        if scale == "none" or not k:
            return (0.0,) * k, (1.0,) * k
        rows = np.sort(train)
        chunks = [rows[i:i + _chunk_rows(k)] for i in range(0, len(rows), _chunk_rows(k))]
        if scale == "minmax":
            lo = np.full(k, np.inf)
            hi = np.full(k, -np.inf)
            for c in chunks:
                b = _numeric_rows(s, layout, c)
                lo, hi = np.minimum(lo, b.min(0)), np.maximum(hi, b.max(0))
            span = hi - lo
            span[span == 0] = 1.0
            return tuple(map(float, lo)), tuple(map(float, span))
        if len(chunks) == 1:
            b = _numeric_rows(s, layout, chunks[0])
            mean, std = b.mean(0), b.std(0)
        else:
            total = np.zeros(k)
            for c in chunks:
                total += _numeric_rows(s, layout, c).sum(0)
            mean = total / len(rows)
            sq = np.zeros(k)
            for c in chunks:
                sq += ((_numeric_rows(s, layout, c) - mean) ** 2).sum(0)
            std = np.sqrt(sq / len(rows))
        std[std == 0] = 1.0
        return tuple(map(float, mean)), tuple(map(float, std))

    # -- loading, each time from the source ------------------------------------------------------

    def _split_sources(self, sources: list[_Source | None], train: np.ndarray,
                       valid: np.ndarray, test: np.ndarray
                       ) -> list[tuple[_Source | None, np.ndarray | None]]:
        """(source, rows) per split; rows None: all of a source of its own."""
        main = sources[0]
        out: list[tuple[_Source | None, np.ndarray | None]] = [(main, train)]
        for own, rows in ((sources[1], valid), (sources[2], test)):
            out.append((own, None) if own is not None else (main, rows))
        return out

    def _splits(self) -> Iterator[tuple[str, _Source, np.ndarray]]:
        """Read the data again and split it as when the dataset was made."""
        sources = self._read()
        main = sources[0]
        assert main is not None
        codes = None
        if self.task == "classification":
            y = self._target(main)
            codes = _class_codes(y, _sorted_unique(y))
        parts = split_rows(main.n, *self._fractions, seed=self.seed, classes=codes)
        rng = np.random.default_rng(self.seed + 1)
        for name, (s, rows) in zip(("train", "valid", "test"),
                                   self._split_sources(sources, *parts), strict=True):
            if s is None:
                yield name, main, np.empty(0, np.int64)
                continue
            if s.n != self.rows[("train", "valid", "test").index(name)] and rows is None:
                raise DataError(f"{s.where} changed since it was read")
            yield name, s, rng.permutation(s.n) if rows is None else rows

    def load(self) -> Dataset:
        """Every split, float32 features (uint8 pixels converted back to float32)."""
        data = self.load_compact(None, None, plain_empty, test=True)
        if self.pixel_scale is None:
            return data
        tr, va, te = (Split(s.x.astype(np.float32) * np.float32(self.pixel_scale), s.y)
                      for s in (data.train, data.valid, data.test))
        return Dataset(self.name, tr, va, te, self.classes, self.task, self.target_scale)

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty, test: bool = False) -> Dataset:
        """The first ``train`` and ``valid`` rows of those splits (None: all; the test
        split only with ``test``), transformed a chunk of rows at a time straight into
        arrays made by ``empty`` (``x_train``, ``y_train``, ...): float32 features, or
        uint8 pixels when ``pixel_scale`` is set."""
        assert self.preprocess is not None
        heads = {"train": train, "valid": valid, "test": None if test else 0}
        out: dict[str, Split] = {}
        for name, s, rows in self._splits():
            head = heads[name]
            rows = rows[:head] if head is not None else rows
            make = empty if name != "test" or test else plain_empty  # no test rows shared
            x = make(f"x_{name}", (len(rows), self.features),
                     np.uint8 if self.pixel_scale is not None else np.float32)
            self._write(s, rows, x)
            y = make(f"y_{name}", (len(rows),), np.float32 if self.task == "regression"
                     else np.int64)
            y[...] = self._encode_target(self._target(s)[rows])
            out[name] = Split(x, y)
        return Dataset(self.name, out["train"], out["valid"], out["test"], self.classes,
                       self.task, self.target_scale)

    def _write(self, s: _Source, rows: np.ndarray, out: np.ndarray) -> None:
        assert self.preprocess is not None
        lay = self._lay
        step = _chunk_rows(max(1, self.features))
        buf = np.empty((min(step, len(rows)), self.features), np.float32)
        for start in range(0, len(rows), step):
            idx = rows[start:start + step]
            order = np.argsort(idx, kind="stable")  # read in file order (memory maps)
            got = idx[order]
            if self.pixel_scale is not None:
                assert s.x is not None
                out[start + order] = s.x[got].reshape(len(got), -1)
                continue
            num = _numeric_rows(s, lay, got)
            cats = [] if s.frame is None else [
                s.frame[{str(c): c for c in s.frame.columns}[c]].to_numpy()[got]
                for c in lay.categorical]
            part = buf[:len(got)]
            self.preprocess.transform_into(num, cats, part)
            out[start + order] = part

    def _encode_target(self, y: np.ndarray) -> np.ndarray:
        assert self.preprocess is not None
        if self.task == "regression":
            mean, std = self.target_scale or (0.0, 1.0)
            return ((np.asarray(y, np.float64) - mean) / std).astype(np.float32)
        codes = _class_codes(y, np.asarray(self.preprocess.labels, dtype=object
                                           if any(isinstance(v, str) for v in
                                                  self.preprocess.labels) else None))
        return codes


def _has_rows(s: _Source, key: str | None) -> None:
    """A source with no rows (a header-only CSV, arrays of length 0) or arrays that are
    not arrays of rows is refused before anything else is said about it."""
    if s.frame is None:
        for what, a in (("features", s.x), ("target", s.y)):
            if not isinstance(a, np.ndarray):
                raise DataError(f"{s.where}: the {what} are not an array "
                                f"({type(a).__name__})", key=key or "x")
            if a.ndim == 0:
                raise DataError(f"{s.where}: the {what} are a single value, not an array "
                                f"of rows", key=key or "x")
    if s.n == 0:
        cols = "" if s.frame is None else \
            f" (columns: {_listing([str(c) for c in s.frame.columns])})"
        raise DataError(f"{s.where}: no rows{cols}: nothing to learn from", key=key)


def _is_fraction(v: Any) -> bool:
    return isinstance(v, float | int) and not isinstance(v, bool)


def _class_codes(y: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Index of each label among the sorted ``labels`` (all present)."""
    if y.dtype == object or labels.dtype == object:
        y, labels = y.astype(str), labels.astype(str)
    return np.searchsorted(labels, y).astype(np.int64)


def _chunk_rows(width: int) -> int:
    return max(1, CHUNK_BYTES // (8 * max(1, width)))


def _blocks(x: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    step = _chunk_rows(int(np.prod(x.shape[1:])))
    for start in range(0, len(x), step):
        yield start, x[start:start + step]


def _numeric_rows(s: _Source, layout: _Layout, rows: np.ndarray) -> np.ndarray:
    """float64 ``[len(rows), numeric]`` of the numeric features of ``rows`` (sorted)."""
    if s.frame is None:
        assert s.x is not None
        return np.asarray(s.x[rows], np.float64).reshape(len(rows), -1)
    col = {str(c): c for c in s.frame.columns}
    if not layout.numeric:
        return np.empty((len(rows), 0))
    return s.frame[[col[c] for c in layout.numeric]].iloc[rows].to_numpy(np.float64)


def _finite(block: np.ndarray, start: int, where: str, names: Sequence[str]) -> None:
    if block.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(block)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise DataError(f"{where}: row {start + r + 1}, column {names[c]!r}: "
                        f"{block[r, c]} (values must be finite numbers)")


def _scalar_cells(s: _Source, column: str, values: np.ndarray, key: str) -> None:
    """A cell holding a list, an array or a mapping (a Parquet list column) is no value
    of a feature or a target."""
    for i, v in enumerate(values):
        if isinstance(v, list | tuple | dict | set | np.ndarray):
            raise DataError(f"{s.where}: row {i + 1}, column {column!r}: holds a list of "
                            "values, not one (a list column is neither a feature nor a "
                            "target)", key=key)


def _need(s: _Source, wanted: Sequence[str], names: list[str], key: str) -> None:
    have = set(names)
    missing = [c for c in wanted if c not in have]
    if missing:
        raise DataError(f"{s.where}: no column {missing[0]!r}; columns: {_listing(names)}",
                        key=key)


def _listing(names: Sequence[str]) -> str:
    return ", ".join(map(str, names[:30])) + (f", ... ({len(names)} in all)"
                                               if len(names) > 30 else "")


def _dupes(names: Sequence[str]) -> str:
    return ", ".join(sorted({n for n in names if list(names).count(n) > 1}))


# -- files and Python data ----------------------------------------------------------------------


def _npz_fits(path: Path, z: Any, names: list[str]) -> None:
    """Refuse an ``.npz`` whose arrays would decompress to more than
    :data:`MAX_NPZ_BYTES`, from their headers, before decompressing anything (a few MB
    of deflated zeros can declare gigabytes)."""
    from numpy.lib import format as npy

    total = 0
    for name in names:
        with z.zip.open(f"{name}.npy") as f:
            version = npy.read_magic(f)
            read = {(1, 0): npy.read_array_header_1_0,
                    (2, 0): npy.read_array_header_2_0}.get(version)
            if read is None:
                raise DataError(f"{path}: array {name!r} is in .npy format {version}; "
                                "save it with numpy.savez (format 1.0 or 2.0)", key="path")
            shape, _, dtype = read(f)
        total += math.prod(shape) * dtype.itemsize
    if total > MAX_NPZ_BYTES:
        raise DataError(f"{path}: its arrays would take {total:,} bytes decompressed, more "
                        f"than the {MAX_NPZ_BYTES:,} an .npz may (it is read into "
                        "memory whole); give larger data as x: and y: .npy files, which "
                        "are memory-mapped", key="path")


def _csv_columns(path: Path) -> int:
    """The columns of a CSV's header line (the first 16 MiB of it at most): pandas
    takes seconds and hundreds of MB to parse a header of 200,000 names alone."""
    import csv

    with open(path, "rb") as f:
        line = f.readline(16 << 20).decode("utf-8", "replace")
    return max((len(r) for r in csv.reader([line.rstrip("\r\n")])), default=0)


def _few_columns(path: Path, n: int, key: str) -> None:
    """A table's columns, from its header, before its rows are read."""
    if n > MAX_FEATURES + 1:
        raise DataError(f"{path}: {n:,} columns, more than the {MAX_FEATURES:,} features "
                        "(and a target) a model's input may have", key=key)


def _not_a_file(path: Path) -> str:
    return "not a regular file (a folder, FIFO, device or socket)" if path.exists() else \
        "no such file"


def _read_file(path: Path, target: str | None, features: Sequence[str] | None,
               key: str = "path") -> _Source:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: unknown format {path.suffix or '(no suffix)'!r}; data files "
                        f"are {', '.join(FORMATS)}", key=key)
    if not path.is_file():
        raise DataError(f"{path}: {_not_a_file(path)}", key=key)
    try:
        if suffix == ".csv":
            _few_columns(path, _csv_columns(path), key)
            return _Source(str(path), frame=_pd().read_csv(path))
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            _few_columns(path, len(pq.read_schema(path).names), key)
            return _Source(str(path), frame=_pd().read_parquet(path))
        if suffix == ".npy":
            raise DataError(f"{path}: a .npy file holds one array: give x: and y: files "
                            f"instead of path:", key=key)
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            tname = target or ("y" if "y" in names else None)
            if tname is None or tname not in names:
                raise DataError(f"{path}: no array {tname!r} for the target; arrays: "
                                f"{', '.join(names)}" if tname else
                                f"{path}: name the target array (target:); arrays: "
                                f"{', '.join(names)}", key="target")
            others = [n for n in names if n != tname]
            if features is not None:
                if len(features) != 1 or features[0] not in names or features[0] == tname:
                    raise DataError(f"{path}: features names the one features array; "
                                    f"arrays: {', '.join(names)}", key="features")
                xname = features[0]
            elif len(others) != 1:
                raise DataError(f"{path}: {len(others)} arrays besides the target "
                                f"({', '.join(others)}); name the features one "
                                f"(features: [name])", key="features")
            else:
                xname = others[0]
            _npz_fits(path, z, [xname, tname])
            return _Source(str(path), x=z[xname], y=z[tname])
    except DataError:
        raise
    except Exception as e:  # a parser's or numpy's own message
        raise DataError(f"{path}: cannot read it: {e}", key=key) from None


def _read_pair(x: Path, y: Path) -> _Source:
    for p, key in ((x, "x"), (y, "y")):
        if p.suffix.lower() != ".npy":
            raise DataError(f"{p}: x and y are .npy files", key=key)
        if not p.is_file():
            raise DataError(f"{p}: {_not_a_file(p)}", key=key)
    try:
        xs = np.load(x, mmap_mode="r", allow_pickle=False)
        ys = np.load(y, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise DataError(f"{x} / {y}: cannot read them: {e}", key="x") from None
    for p, a, key in ((x, xs, "x"), (y, ys, "y")):
        if not isinstance(a, np.ndarray):  # np.load opens an .npz whatever its name
            for b in (xs, ys):
                if hasattr(b, "close"):
                    b.close()
            raise DataError(f"{p}: not a .npy array but an .npz archive (arrays: "
                            f"{_listing(list(a.files))}); give it as path:", key=key)
    return _Source(f"{x}", x=xs, y=np.asarray(ys))


def from_file(path: str | Path | None = None, target: str | None = None, *,
              x: str | Path | None = None, y: str | Path | None = None,
              features: Sequence[str] | None = None, categorical: Sequence[str] = (),
              valid: float | str | Path = 0.2, test: float | str | Path = 0.0,
              scale: str = "standard", task: str | None = None, seed: int = 0,
              name: str | None = None) -> TableDataset:
    """A data file as a :class:`TableDataset`: ``path`` to a ``.csv``, ``.parquet`` or
    ``.npz`` (``target`` names a column or an array; an ``.npz``'s features are its
    one other array, or ``features: [name]``), or ``x`` and ``y`` ``.npy`` files
    (memory-mapped: a large one is read a chunk at a time).  ``valid`` and ``test`` are
    fractions or files of the same format.  Raises :class:`DataError`.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> np.save(f"{d}/x.npy", np.arange(40.0).reshape(20, 2))
    >>> np.save(f"{d}/y.npy", np.array([0, 1] * 10))
    >>> ds = from_file(x=f"{d}/x.npy", y=f"{d}/y.npy", valid=0.25)
    >>> ds.rows, ds.classes
    ((15, 5, 0), 2)
    """
    if (path is None) == (x is None or y is None) or (x is None) != (y is None):
        raise DataError("give either path (a .csv, .parquet or .npz) or x and y (.npy files)",
                        key="path")
    names = (target, features)  # columns, or for an .npz the arrays to read
    if path is not None:
        main = Path(path)

        def first() -> _Source:
            return _read_file(main, *names)
    else:
        assert x is not None and y is not None
        xp, yp = Path(x), Path(y)

        def first() -> _Source:
            return _read_pair(xp, yp)

    def other(v: Any, key: str) -> _Source | None:
        if _is_fraction(v):
            return None
        p = Path(v)
        if path is None:  # arrays: a split of its own is an .npz of the same arrays
            return _read_file(p, None, None, key=key)
        return _read_file(p, *names, key=key)

    def read() -> list[_Source | None]:
        return [first(), other(valid, "valid"), other(test, "test")]

    label = name or (Path(path).stem if path is not None else Path(str(x)).stem)
    if path is not None and Path(path).suffix.lower() == ".npz":
        target = None  # the arrays are already chosen
        features = None
    return TableDataset._from_reader(read, target, features, categorical, valid, test, scale,
                                     task, seed, label)


def from_python(data: Table, target: str | None = None, **options: Any) -> TableDataset:
    """A :class:`TableDataset` of data held in Python: a DataFrame (``target`` names a
    column) or a pair ``(X, y)`` of arrays or lists; ``options`` are the
    :class:`TableDataset` ones (``features``, ``categorical``, ``valid``, ``test``,
    ``scale``, ``task``, ``seed``, ``name``).  The data is referred to, not copied: do
    not change it while a run uses it.

    >>> ds = from_python(([[0.0], [1.0], [2.0], [3.0], [4.0]], ["a", "b", "a", "b", "a"]),
    ...                  valid=0.2)
    >>> ds.classes, ds.preprocess.labels
    (2, ('a', 'b'))
    """
    if _is_frame(data) and target is None:
        raise DataError(f"name the target column: target=...; columns: "
                        f"{_listing([str(c) for c in data.columns])}", key="target")
    return TableDataset(data, target, **options)


def resolve(section: DataSection) -> BaseDataset:
    """The data set a search space's ``dataset:`` section names: a registered one by
    ``name`` (configured with the section's table options where it takes them), or a
    file (:func:`from_file`).  Reads and checks a file (:class:`DataError`); callers
    cache the result (:attr:`explore.space.Space.data`).

    >>> from types import SimpleNamespace as NS
    >>> resolve(NS(name="digits", valid=100, test=None, scale=None, seed=None)).features
    64
    """
    from explore.datasets._base import get

    if section.name is not None:
        ds = get(section.name)
        options = {"valid": section.valid if isinstance(section.valid, float) else None,
                   "test": section.test, "scale": section.scale, "seed": section.seed}
        given = [k for k, v in options.items() if v is not None]
        refused = [k for k in given if k not in ds.options]
        if refused:
            raise DataError(f"dataset {section.name!r} has fixed splits and scaling; it "
                            f"takes no {refused[0]} (only row counts: train, valid)",
                            key=refused[0])
        return ds.configure(**{k: options[k] for k in given})
    # an integer valid is a head count of the split (explore.space.Dataset.heads)
    valid = section.valid if isinstance(section.valid, float | Path) else 0.2
    return from_file(
        section.path, section.target, x=section.x, y=section.y, features=section.features,
        categorical=section.categorical or (), valid=valid,
        test=0.0 if section.test is None else section.test,
        scale=section.scale or "standard", task=section.task, seed=section.seed or 0)
