"""Which columns of a table are what, and whether their values will do.

:func:`layout_of` decides once, from the main source, which column is the target and
which features are numeric or categorical (a :class:`Layout`); :func:`check_columns`
checks every source's columns against it (their values' gaps are
:mod:`~explore.datasets.missing`'s); :func:`train_categories` and :func:`fit_scaling`
learn from the training rows what :class:`~explore.datasets.preprocess.Preprocess`
applies.  Numeric features are read
a chunk of rows at a time (:func:`chunk_rows`), so a large source is never converted
whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from explore.datasets.errors import DataError, listing
from explore.datasets.preprocess import _pd
from explore.datasets.source import Source

if TYPE_CHECKING:
    import pandas as pd

SCALES = ("none", "standard", "minmax")
CHUNK_BYTES = 4 << 20  # rows read and converted at a time: about this many float64 bytes
# search_spaces/README.md, "Limits": checked before anything is allocated
MAX_FEATURES = 100_000  # columns of a table, features of arrays, after one-hot encoding
MAX_CATEGORIES = 10_000  # categories of one categorical column


def is_numeric(a: np.ndarray | pd.Series) -> bool:
    """Numbers or booleans, by the dtype of an array or of a DataFrame's column."""
    if isinstance(a, np.ndarray):
        return a.dtype.kind in "biuf"
    types = _pd().api.types
    if types.is_complex_dtype(a):  # real numbers only: the imaginary part would be lost
        return False
    return bool(types.is_numeric_dtype(a) or types.is_bool_dtype(a))


@dataclass
class Layout:
    """Which columns are what, decided once from the main source."""

    target: str | None
    numeric: list[str]
    categorical: list[str]
    int_categories: dict[str, bool] = field(default_factory=dict)  # else text


def layout_of(s: Source, target: str | None, features: Sequence[str] | None,
              categorical: Sequence[str]) -> Layout:
    """The layout of the main source ``s`` with the columns named (arrays name none:
    their features are all numeric), or a :class:`DataError` saying what is wrong."""
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
            return Layout(None, list(s.names), [])
        return Layout(None, [f"x{i}" for i in range(width)], [])
    frame = s.frame
    names = [str(c) for c in frame.columns]
    if len(set(names)) != len(names):
        raise DataError(f"{s.where}: duplicate column names: {_dupes(names)}")
    if target is None:
        raise DataError(f"{s.where}: name the target column (target:); columns: "
                        f"{listing(names)}", key="target")
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
        raise DataError(f"categorical columns {listing(stray)} are not among the "
                        f"features", key="categorical")
    if not feats:
        raise DataError(f"{s.where}: no feature columns besides the target {target!r}",
                        key="features")
    col = {str(c): c for c in frame.columns}
    for c in [*feats, target]:
        if frame[col[c]].dtype == object:
            _scalar_cells(s, c, frame[col[c]].to_numpy(),
                          "target" if c == target else "categorical")
    text = [c for c in feats if c not in cats and not is_numeric(frame[col[c]])]
    if text:
        raise DataError(f"{s.where}: the columns {listing(text)} are not numeric; "
                        f"list them under categorical (one-hot encoded) or leave them "
                        f"out of the features", key="categorical")
    ints = {c: _integer_categories(frame[col[c]]) for c in cats}
    return Layout(target, [c for c in feats if c not in cats],
                  [c for c in feats if c in cats], ints)


def _integer_categories(column: pd.Series) -> bool:
    """Whether a categorical column's categories are integers: an integer or boolean
    column, or a float one whose values are all integers with some missing (pandas
    reads a CSV column of integers with an empty field as floats)."""
    types = _pd().api.types
    if types.is_integer_dtype(column) or types.is_bool_dtype(column):
        return True
    if not types.is_float_dtype(column):
        return False
    v = column.to_numpy(np.float64, na_value=np.nan)
    known = v[~np.isnan(v)]
    return len(known) < len(v) and bool(np.all(np.isfinite(known) & (known % 1 == 0)))


def input_columns(s: Source, layout: Layout) -> list[str]:
    """The raw input columns the features come from, in the source's order."""
    if s.frame is None:
        return layout.numeric
    keep = set(layout.numeric) | set(layout.categorical)
    return [str(c) for c in s.frame.columns if str(c) in keep]


def check_columns(s: Source, layout: Layout) -> None:
    """Every source has the columns of the layout, of its kinds, and arrays their
    shapes.  (Their values' gaps are :func:`explore.datasets.missing.scan`'s.)"""
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
        if not is_numeric(x):
            raise DataError(f"{s.where}: the features are {x.dtype}, not numbers", key="x")
        return
    frame = s.frame
    names = [str(c) for c in frame.columns]
    need = [*layout.numeric, *layout.categorical]
    if layout.target is not None:
        need.append(layout.target)
    _need(s, need, names, "features")
    col = {str(c): c for c in frame.columns}
    text = [c for c in layout.numeric if not is_numeric(frame[col[c]])]
    if text:
        raise DataError(f"{s.where}: the columns {listing(text)} are not numeric",
                        key="categorical")


def train_categories(s: Source, layout: Layout, column: str,
                     train: np.ndarray) -> tuple[Any, ...]:
    """The sorted categories of the categorical ``column`` in the ``train`` rows
    (missing values are none): integers for an integer or boolean column, else text."""
    assert s.frame is not None
    values = s.frame[{str(c): c for c in s.frame.columns}[column]].to_numpy()[train]
    values = values[~np.asarray(_pd().isna(values), bool)]
    if layout.int_categories.get(column):  # bools as 0 and 1; a uint64 kept whole
        if values.dtype == bool:
            values = values.astype(np.int64)
        elif values.dtype == object:
            values = np.asarray([int(v) for v in values], dtype=object)
        return tuple(int(v) for v in np.unique(values))
    return tuple(str(v) for v in np.unique(values.astype(str)))


def check_encoded_width(where: str, layout: Layout,
                        categories: tuple[tuple[Any, ...], ...]) -> None:
    """The one-hot encoding of ``categories`` (per categorical column) stays within
    :data:`MAX_CATEGORIES` a column and :data:`MAX_FEATURES` in all."""
    for c, cats in zip(layout.categorical, categories, strict=True):
        if len(cats) > MAX_CATEGORIES:
            raise DataError(f"{where}: the categorical column {c!r} has "
                            f"{len(cats):,} categories in the training rows, more than "
                            f"the {MAX_CATEGORIES:,} a column may one-hot encode to; "
                            "is it an identifier? leave it out of the features",
                            key="categorical")
    width = len(layout.numeric) + sum(map(len, categories))
    if width > MAX_FEATURES:
        raise DataError(f"{where}: {width:,} features after one-hot encoding, "
                        f"more than the {MAX_FEATURES:,} a model's input may have",
                        key="categorical" if categories else "features")


def fit_scaling(s: Source, train: np.ndarray, layout: Layout, scale: str,
                fill: Sequence[float] = ()) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(offset, scale) per numeric feature over the training rows, a chunk at a time
    (one chunk for a table that small: numpy's own mean and std), their missing values
    taken as ``fill`` (per numeric feature; empty: there are none)."""
    k = len(layout.numeric)
    if scale == "none" or not k:
        return (0.0,) * k, (1.0,) * k
    rows = np.sort(train)
    chunks = [rows[i:i + chunk_rows(k)] for i in range(0, len(rows), chunk_rows(k))]
    if scale == "minmax":
        lo = np.full(k, np.inf)
        hi = np.full(k, -np.inf)
        for c in chunks:
            b = numeric_rows(s, layout, c, fill)
            lo, hi = np.minimum(lo, b.min(0)), np.maximum(hi, b.max(0))
        span = hi - lo
        span[span == 0] = 1.0
        return tuple(map(float, lo)), tuple(map(float, span))
    if len(chunks) == 1:
        b = numeric_rows(s, layout, chunks[0], fill)
        mean, std = b.mean(0), b.std(0)
    else:
        total = np.zeros(k)
        for c in chunks:
            total += numeric_rows(s, layout, c, fill).sum(0)
        mean = total / len(rows)
        sq = np.zeros(k)
        for c in chunks:
            sq += ((numeric_rows(s, layout, c, fill) - mean) ** 2).sum(0)
        std = np.sqrt(sq / len(rows))
    std[std == 0] = 1.0
    return tuple(map(float, mean)), tuple(map(float, std))


def numeric_rows(s: Source, layout: Layout, rows: np.ndarray,
                 fill: Sequence[float] = ()) -> np.ndarray:
    """float64 ``[len(rows), numeric]`` of the numeric features of ``rows`` (sorted),
    a missing value (pandas' NA too) as NaN, or as the ``fill`` of its column when
    that is given."""
    if s.frame is None:
        assert s.x is not None
        out = np.asarray(s.x[rows], np.float64).reshape(len(rows), -1)
    elif not layout.numeric:
        return np.empty((len(rows), 0))
    else:
        col = {str(c): c for c in s.frame.columns}
        out = s.frame[[col[c] for c in layout.numeric]].iloc[rows].to_numpy(
            np.float64, na_value=np.nan)
    if len(fill):
        gap = np.isnan(out)
        if gap.any():
            out = np.where(gap, np.asarray(fill, np.float64), out)
    return out


def chunk_rows(width: int) -> int:
    """Rows of ``width`` values read and converted at a time."""
    return max(1, CHUNK_BYTES // (8 * max(1, width)))


def _scalar_cells(s: Source, column: str, values: np.ndarray, key: str) -> None:
    """A cell holding a list, an array or a mapping (a Parquet list column) is no value
    of a feature or a target."""
    for i, v in enumerate(values):
        if isinstance(v, list | tuple | dict | set | np.ndarray):
            raise DataError(f"{s.where}: row {i + 1}, column {column!r}: holds a list of "
                            "values, not one (a list column is neither a feature nor a "
                            "target)", key=key)


def _need(s: Source, wanted: Sequence[str], names: list[str], key: str) -> None:
    have = set(names)
    missing = [c for c in wanted if c not in have]
    if missing:
        raise DataError(f"{s.where}: no column {missing[0]!r}; columns: {listing(names)}",
                        key=key)


def _dupes(names: Sequence[str]) -> str:
    return ", ".join(sorted({n for n in names if list(names).count(n) > 1}))
