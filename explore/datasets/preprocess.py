"""The preprocessing a table's data set learned on its training split
(:class:`Preprocess`): stored with the study, it turns raw rows into the model's
features and the model's outputs back into labels or target units."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from explore.datasets.errors import DataError


def _pd() -> Any:
    """pandas, imported when a table needs it: it is about 30 MB of every process's
    memory, and the run's workers and a built-in's run never need it."""
    import pandas  # noqa: PLC0415 (30 MB most processes never need)

    return pandas


def _is_frame(x: Any) -> bool:
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(x, pd.DataFrame)


def _plain(v: Any) -> Any:
    """A JSON value of a numpy scalar (labels, categories)."""
    return v.item() if isinstance(v, np.generic) else v


@dataclass(frozen=True)
class Preprocess:
    """What was learned on the training split, to turn raw rows into the model's
    features (and its outputs back into labels or target units).  Stored with the
    study as :meth:`to_dict`.

    The features are, in this order: the numeric columns in ``columns`` order, each
    ``(x - offset) / scale``, then for each categorical column in ``columns`` order
    one 0/1 feature per category (``feature_names`` says ``column=category``); a
    category not seen in training is all zeros.

    Fitted with ``dataset.missing: impute`` (``impute`` names the numeric statistic),
    a missing value takes its column's ``fill`` (numeric, before scaling) or
    ``fill_categories`` (categorical) value: NaN, None or pandas' NA, and in a text
    column also an empty string (how an ONNX string input says missing) unless that
    is one of its categories.  Otherwise a missing numeric value stays NaN and a
    missing category is all zeros.

    >>> p = Preprocess(columns=("age", "plan"), numeric=("age",), offset=(40.0,),
    ...                scale=(10.0,), categorical=("plan",), categories=(("a", "b"),),
    ...                labels=("no", "yes"))
    >>> import pandas as pd
    >>> p.transform(pd.DataFrame({"age": [50, 30], "plan": ["b", "z"]})).tolist()
    [[1.0, 0.0, 1.0], [-1.0, 0.0, 0.0]]
    >>> p.labels_of(np.array([1, 0])).tolist()
    ['yes', 'no']
    >>> Preprocess.from_dict(p.to_dict()) == p
    True
    >>> q = Preprocess(columns=("age", "plan"), numeric=("age",), offset=(40.0,),
    ...                scale=(10.0,), categorical=("plan",), categories=(("a", "b"),),
    ...                impute="median", fill=(45.0,), fill_categories=("b",))
    >>> q.transform(pd.DataFrame({"age": [None, 30], "plan": ["a", None]})).tolist()
    [[0.5, 1.0, 0.0], [-1.0, 0.0, 1.0]]
    """

    columns: tuple[str, ...]  # the raw input columns, in order
    numeric: tuple[str, ...]  # those scaled, in columns order
    offset: tuple[float, ...]  # per numeric column
    scale: tuple[float, ...]
    categorical: tuple[str, ...] = ()  # those one-hot encoded, in columns order
    categories: tuple[tuple[Any, ...], ...] = ()  # per categorical column (str or int)
    task: str = "classification"
    labels: tuple[Any, ...] = ()  # the original class labels of indices 0..C-1
    target_scale: tuple[float, float] | None = None  # regression: the y's (mean, std)
    scaling: str = "standard"  # how offset and scale were fitted (none, standard, minmax)
    # dataset.missing: impute: the numeric statistic (mean, median, most_frequent); None:
    # nothing is imputed
    impute: str | None = None
    fill: tuple[float, ...] = ()  # per numeric column: its missing values' value
    fill_categories: tuple[Any, ...] = ()  # per categorical column: its missing ones'

    @property
    def feature_names(self) -> tuple[str, ...]:
        return (*self.numeric, *(f"{c}={v}" for c, cats in zip(self.categorical,
                                                                self.categories,
                                                                strict=True) for v in cats))

    @property
    def features(self) -> int:
        return len(self.numeric) + sum(len(c) for c in self.categories)

    def transform(self, rows: Any) -> np.ndarray:
        """float32 ``[n, features]`` of raw ``rows``: a DataFrame (columns by name) or
        a numeric array of the numeric columns in ``columns`` order (its trailing axes
        flattened: images)."""
        if _is_frame(rows):
            by_name = {str(c): c for c in rows.columns}  # as training named them
            missing = [c for c in self.columns if c not in by_name]
            if missing:
                raise DataError(f"rows lack the columns {', '.join(map(repr, missing))}")
            num = np.empty((len(rows), len(self.numeric)))
            for j, c in enumerate(self.numeric):
                column = rows[by_name[c]]
                if getattr(column.dtype, "kind", "O") in "cmM":  # complex, times
                    raise DataError(f"rows: column {c!r} is {column.dtype}, not real numbers")
                try:
                    num[:, j] = column.to_numpy(np.float64, na_value=np.nan)
                except (TypeError, ValueError) as e:
                    raise DataError(f"rows: column {c!r} is not numbers ({e})") from None
            cats = [rows[by_name[c]].to_numpy() for c in self.categorical]
        else:
            if self.categorical:
                raise DataError("rows with categorical columns must be a DataFrame")
            num = _numeric_rows(rows, len(self.numeric))
            if num.shape[1] != len(self.numeric):
                one = " (one row? give it as [1, n]: x.reshape(1, -1))" if num.shape[1] == 1 \
                    and len(num) == len(self.numeric) else ""
                raise DataError(f"rows have {num.shape[1]} values; expected "
                                f"{len(self.numeric)} ({', '.join(self.numeric[:5])}...)"
                                + one)
            cats = []
        out = np.empty((len(num), self.features), np.float32)
        self.transform_into(num, cats, out)
        bad = ~np.isfinite(out)
        if bad.any():  # said here by row and column, not by the engine's input buffer
            row, j = (int(v[0]) for v in np.nonzero(bad))
            raw = num[row, j] if j < len(self.numeric) else None
            unfilled = raw is not None and raw != raw and not self.fill
            raise DataError(f"rows: {self.feature_names[j]!r} is {raw} at row {row}: "
                            "a model takes finite values (within float32)"
                            + (" and this one fills no missing ones (its search had none, "
                               "or dropped them)" if unfilled else ""))
        return out

    def transform_into(self, numeric: np.ndarray, categorical: Sequence[np.ndarray],
                       out: np.ndarray) -> None:
        """Write the features of a block of rows into ``out`` (float32 ``[k,
        features]``): ``numeric`` is ``[k, len(numeric)]``, ``categorical`` one array
        of raw values per categorical column."""
        k = len(numeric)
        nn = len(self.numeric)
        if nn:
            if self.fill:
                gap = np.isnan(numeric)
                if gap.any():
                    numeric = np.where(gap, np.asarray(self.fill, np.float64), numeric)
            block = np.subtract(numeric, np.asarray(self.offset), dtype=np.float64)
            block /= np.asarray(self.scale)
            with np.errstate(over="ignore"):  # beyond float32: refused by the caller
                out[:, :nn] = block
        at = nn
        fills = self.fill_categories or (None,) * len(self.categories)
        for values, cats, fill in zip(categorical, self.categories, fills, strict=True):
            part = out[:, at:at + len(cats)]
            part[...] = 0
            codes = _codes(values, cats)
            if fill is not None:
                codes[_missing(values, cats)] = cats.index(fill)
            hit = codes >= 0
            part[np.flatnonzero(hit), codes[hit]] = 1
            at += len(cats)
        assert at == out.shape[1] and len(out) == k

    def labels_of(self, classes: np.ndarray) -> np.ndarray:
        """The original labels of class indices (a classification's predictions)."""
        return np.asarray(self.labels, dtype=object if any(
            isinstance(v, str) for v in self.labels) else None)[np.asarray(classes)]

    def unscale(self, y: np.ndarray) -> np.ndarray:
        """A regression's standardized outputs in the target's units."""
        mean, std = self.target_scale or (0.0, 1.0)
        return np.asarray(y, np.float64) * std + mean

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (lists, strings, numbers, None)."""
        return {"columns": list(self.columns), "numeric": list(self.numeric),
                "offset": [float(v) for v in self.offset],
                "scale": [float(v) for v in self.scale],
                "categorical": list(self.categorical),
                "categories": [[_plain(v) for v in c] for c in self.categories],
                "task": self.task, "labels": [_plain(v) for v in self.labels],
                "target_scale": None if self.target_scale is None else
                [float(v) for v in self.target_scale],
                "scaling": self.scaling, "impute": self.impute,
                "fill": [float(v) for v in self.fill],
                "fill_categories": [_plain(v) for v in self.fill_categories],
                "feature_names": list(self.feature_names)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocess:
        ts = d.get("target_scale")
        return cls(columns=tuple(d["columns"]), numeric=tuple(d["numeric"]),
                   offset=tuple(float(v) for v in d["offset"]),
                   scale=tuple(float(v) for v in d["scale"]),
                   categorical=tuple(d.get("categorical", ())),
                   categories=tuple(tuple(c) for c in d.get("categories", ())),
                   task=d.get("task", "classification"), labels=tuple(d.get("labels", ())),
                   target_scale=None if ts is None else (float(ts[0]), float(ts[1])),
                   scaling=d.get("scaling", "standard"), impute=d.get("impute"),
                   fill=tuple(float(v) for v in d.get("fill", ())),
                   fill_categories=tuple(d.get("fill_categories", ())))


def _numeric_rows(rows: Any, width: int) -> np.ndarray:
    """``rows`` (an array, a list of rows; images flattened) as float64 ``[n, k]``, or
    a :class:`DataError` saying what they are instead."""
    try:
        a = np.asarray(rows)
    except (TypeError, ValueError) as e:  # ragged lists of rows
        raise DataError(f"rows are not an array of numbers [n, {width}]: {e}") from None
    if a.ndim == 0:
        raise DataError(f"rows are one value ({type(rows).__name__}): give an array "
                        f"[n, {width}] or a DataFrame")
    if a.dtype.kind not in "biuf":
        raise DataError(f"rows are of dtype {a.dtype}, not numbers: give an array "
                        f"[n, {width}] of numbers or a DataFrame")
    if a.size == 0:
        return np.empty((len(a), width))
    return a.reshape(len(a), -1) if a.ndim != 2 else a


def _codes(values: np.ndarray, cats: tuple[Any, ...]) -> np.ndarray:
    """Index of each value among ``cats`` (-1 where absent), text compared as text."""
    if cats and isinstance(cats[0], str):
        values = np.asarray(values).astype(str)
    elif cats and np.asarray(values).dtype == bool:  # bools are the categories 0, 1
        values = np.asarray(values).astype(np.int64)
    elif cats and np.asarray(values).dtype == object:  # pandas' nullable booleans too
        values = np.asarray([int(v) if isinstance(v, bool | np.bool_) else v
                             for v in np.asarray(values)], dtype=object)
    return np.asarray(_pd().Index(list(cats)).get_indexer(values), np.int64)


def _missing(values: np.ndarray, cats: tuple[Any, ...]) -> np.ndarray:
    """Which ``values`` are missing: NaN, None, pandas' NA, and in a text column an
    empty string that is not one of its categories ``cats`` (an ONNX string input has
    no other way to say missing)."""
    gap = np.asarray(_pd().isna(values), bool)
    if cats and isinstance(cats[0], str) and "" not in cats:
        gap |= np.asarray(values, dtype=object) == ""
    return gap
