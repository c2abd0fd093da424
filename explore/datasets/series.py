"""Windows of a time series as a data set: :class:`SeriesDataset`, the search space's
``dataset: {kind: series, ...}`` (:func:`series_from_file`), the built-in ``sunspots``
(:mod:`explore.datasets._sunspots`) and a baseline to beat, :func:`seasonal_naive`.

A row of the data set is a window of ``window`` consecutive time steps of the input
``columns`` (``[window, len(columns)]`` flattened step by step: a
:class:`~explore.datasets.sequence_shape.SequenceShape`), its target the ``target``
column ``horizon`` steps after the window's last step.  Windows start every
``stride`` steps.

Nothing of the future leaks into training:

- the time axis is cut into three contiguous parts, train first, then valid, then
  test (``valid`` and ``test`` are fractions of the time steps);
- a window and its target lie inside one part: the windows that would straddle a cut
  are dropped (each part needs ``window + horizon`` steps for one window);
- the inputs' scaling (``standard`` or ``minmax``, per column) and a regression's
  ``target_scale`` are fitted on the training part's steps alone, a
  classification's classes on its targets.

Missing or infinite values are refused, naming the column and the row.

>>> import numpy as np
>>> t = np.arange(100.0)
>>> ds = SeriesDataset({"load": np.sin(t / 5), "temp": t % 7}, "load",
...                    columns=["load", "temp"], window=8, horizon=2)
>>> ds.sequence, ds.rows, ds.bounds
(SequenceShape(length=8, channels=2, vocab=None, pad=None, masked=False), (61, 11, 1), (70, 90))
>>> x = ds.load().train.x
>>> x.shape, x[0].reshape(8, 2).shape  # a row is 8 steps of (load, temp)
((61, 16), (8, 2))
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from explore.datasets._base import TASKS, BaseDataset, LoadedData, Split
from explore.datasets.data_files import read_file
from explore.datasets.errors import DataError, listing
from explore.datasets.missing import csv_lines
from explore.datasets.preprocess import Preprocess, _is_frame, _pd, _plain
from explore.datasets.sequence_shape import SequenceShape
from explore.datasets.target import (
    check_classes_seen,
    check_target,
    encoded,
    sorted_unique,
)

SCALES = ("standard", "minmax", "none")


def time_cuts(n: int, valid: float, test: float) -> tuple[int, int]:
    """Where the time axis of ``n`` steps is cut: train is ``[0, a)``, valid ``[a,
    b)``, test ``[b, n)``; ``valid`` and ``test`` are fractions of the steps (rounded,
    at least one step each when above 0).

    >>> time_cuts(309, 0.2, 0.2)
    (185, 247)
    """
    n_valid = 0 if valid <= 0 else max(1, round(valid * n))
    n_test = 0 if test <= 0 else max(1, round(test * n))
    return n - n_valid - n_test, n - n_test


def window_starts(lo: int, hi: int, window: int, horizon: int, stride: int) -> np.ndarray:
    """First steps of the windows that lie, with their target ``horizon`` steps after
    their last step, inside the steps ``[lo, hi)``: every ``stride``-th from ``lo``.

    >>> window_starts(0, 10, 3, 2, 2).tolist()  # windows 0-2 (target 4) ... 4-6 (8)
    [0, 2, 4]
    """
    last = hi - window - horizon  # the last start whose target is before hi
    return np.arange(lo, last + 1, stride, dtype=np.int64) if last >= lo else \
        np.empty(0, np.int64)


def _positive(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise DataError(f"{key}: a whole number of time steps of at least 1, got {v!r}",
                        key=key)
    return int(v)


class SeriesDataset(BaseDataset):
    """Windows of the time series ``data`` (a DataFrame, or a mapping of column names to
    1-D arrays): see the module for the layout and the split.  ``target`` names the
    column predicted, ``columns`` the inputs (default: the target alone), ``time`` a
    column to sort the steps by (default: their order in ``data``).  ``task`` is
    ``regression`` (the target standardized with ``target_scale``) or
    ``classification`` (the target's values are the classes, learned on the training
    part).  Raises :class:`DataError` naming the option at fault.

    Attributes besides :class:`BaseDataset`'s: ``name``, ``rows`` (windows in train,
    valid, test), ``steps`` (time steps in all), ``bounds`` (the cuts ``(a, b)``:
    train is steps ``[0, a)``), ``starts`` (each split's windows' first steps),
    ``target``, ``columns``, ``window``, ``horizon``, ``stride``.
    """

    def __init__(self, data: Any, target: str, *, columns: Sequence[str] | None = None,
                 time: str | None = None, window: int, horizon: int = 1, stride: int = 1,
                 task: str = "regression", valid: float = 0.2, test: float = 0.1,
                 scale: str = "standard", name: str = "series",
                 where: str = "the series", csv: Path | None = None) -> None:
        self.window = _positive("window", window)
        self.horizon = _positive("horizon", horizon)
        self.stride = _positive("stride", stride)
        if task not in TASKS:
            raise DataError(f"task {task!r}: one of {', '.join(TASKS)}", key="task")
        if scale not in SCALES:
            raise DataError(f"scale {scale!r}: one of {', '.join(SCALES)}", key="scale")
        for key, v, low in (("valid", valid, 0.0), ("test", test, -1.0)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not low < v < 1:
                raise DataError(f"{key}: a fraction of the time steps in "
                                f"{'(0, 1)' if low == 0 else '[0, 1)'}, got {v!r}", key=key)
        self.name, self.task, self.scaling = name, task, scale
        self._where, self._csv = where, csv
        table = _columns_of(data, where)
        self.target = target
        self.columns = (columns,) if isinstance(columns, str) else \
            tuple(columns) if columns is not None else (target,)
        self._check_names(table, time)
        order = self._time_order(table, time)
        values = np.empty((len(order), len(self.columns)), np.float64)
        for i, c in enumerate(self.columns):
            col = table[c]
            if col.dtype.kind not in "biuf":
                raise DataError(f"{where}: the input column {c!r} is {col.dtype} "
                                f"({_plain(col[0])!r}, ...), not numbers: a window's "
                                "steps are numeric",
                                key="columns" if columns is not None else "target")
            self._refuse_gaps(c, col, "columns" if columns is not None else "target")
            values[:, i] = col[order]
        y = table[target]
        self._refuse_gaps(target, y, "target")
        y = y[order]
        self.steps = len(order)
        self.bounds = time_cuts(self.steps, float(valid), float(test))
        self.starts = self._windows((0, *self.bounds, self.steps))
        train_y = y[:self.bounds[0]]
        check_target(where, repr(target), train_y, task)
        # the fitted transformation, from the training part's steps only
        offset, spread = _fit_scale(values[:self.bounds[0]], scale)
        labels: tuple[Any, ...] = ()
        target_scale = None
        if task == "classification":
            seen = sorted_unique(y[self.target_index(self.starts[0])])
            labels = tuple(_plain(v) for v in seen)
            if len(labels) < 2:
                raise DataError(f"{where}: the training windows' targets have one class "
                                f"({labels[0]!r}): nothing to classify", key="target")
            for part, starts in (("validation", self.starts[1]), ("test", self.starts[2])):
                check_classes_seen(f"{where} ({part} part)", y[self.target_index(starts)],
                                   labels)
        else:
            target_scale = (float(np.mean(train_y, dtype=np.float64)),
                            float(np.std(train_y, dtype=np.float64)) or 1.0)
        names = tuple(f"{c}[t-{self.window - 1 - s}]" if s < self.window - 1 else f"{c}[t]"
                      for s in range(self.window) for c in self.columns)
        self.preprocess = Preprocess(
            columns=names, numeric=names,
            offset=tuple(map(float, np.tile(offset, self.window))),
            scale=tuple(map(float, np.tile(spread, self.window))), task=task, labels=labels,
            target_scale=target_scale, scaling=scale)
        self._values = ((values - offset) / spread).astype(np.float32)
        self._y = y
        self.target_scale = target_scale
        self.classes = len(labels)
        self.sequence = SequenceShape(self.window, len(self.columns))
        self.features = self.sequence.features
        self.image = None
        self.pixel_scale = None
        self.rows = (len(self.starts[0]), len(self.starts[1]), len(self.starts[2]))
        self.valid = self.rows[1]

    def target_index(self, starts: np.ndarray) -> np.ndarray:
        """The step of each window's target, of the windows beginning at ``starts``."""
        return starts + self.window - 1 + self.horizon

    def target_values(self, index: np.ndarray) -> np.ndarray:
        """The target column (in time order) at the steps ``index``, as read."""
        return self._y[index]

    def _check_names(self, table: dict[str, np.ndarray], time: str | None) -> None:
        have = list(table)
        for key, names in (("target", [self.target]), ("columns", self.columns),
                           ("time", [] if time is None else [time])):
            for c in names:
                if c not in table:
                    raise DataError(f"{self._where}: no column {c!r} ({key}); columns: "
                                    f"{listing(have)}", key=key)
        if not self.columns:
            raise DataError("columns: name at least one input column", key="columns")
        if len(set(self.columns)) < len(self.columns):
            twice = next(c for c in self.columns if self.columns.count(c) > 1)
            raise DataError(f"columns: {twice!r} is listed twice", key="columns")
        if time is not None and (time in self.columns or time == self.target):
            raise DataError(f"time: {time!r} orders the steps; it is not also an input or "
                            "the target", key="time")

    def _time_order(self, table: dict[str, np.ndarray], time: str | None) -> np.ndarray:
        n = len(next(iter(table.values())))
        if time is None:
            return np.arange(n)
        t = table[time]
        self._refuse_gaps(time, t, "time")
        try:
            order = np.argsort(t, kind="stable")
        except TypeError:
            raise DataError(f"{self._where}: the time column {time!r} mixes values that "
                            "do not compare (numbers and text?)", key="time") from None
        ts = t[order]
        same = np.flatnonzero(ts[1:] == ts[:-1])
        if len(same):
            raise DataError(f"{self._where}: the time column {time!r} has "
                            f"{_plain(ts[same[0]])!r} twice: one row per time step",
                            key="time")
        return order

    def _refuse_gaps(self, name: str, col: np.ndarray, key: str) -> None:
        """A column's missing or infinite values, refused at its first one."""
        if col.dtype.kind == "f":
            bad = ~np.isfinite(col)
        elif col.dtype == object:
            bad = np.asarray(_pd().isna(col), bool)
        elif col.dtype.kind == "M":
            bad = np.isnat(col)
        else:
            return
        if not bad.any():
            return
        at = int(np.flatnonzero(bad)[0])
        line = csv_lines(self._csv, [at]).get(at) if self._csv is not None else None
        where = f"row {at}" + (f" (line {line})" if line else "")
        raise DataError(f"{self._where}: the column {name!r} has a missing or infinite "
                        f"value at {where} ({int(bad.sum()):,} in all): a series "
                        "needs every step; fill them first (e.g. pandas' interpolate)",
                        key=key)

    def _windows(self, cuts: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        parts = list(itertools.pairwise(cuts))
        starts = tuple(window_starts(lo, hi, self.window, self.horizon, self.stride)
                       for lo, hi in parts)
        need = self.window + self.horizon
        names = ("train", "valid", "test")
        # train and valid need windows; test only when it has steps (test: 0 has none)
        short = [names[i] for i, (st, (lo, hi)) in enumerate(zip(starts, parts, strict=True))
                 if not len(st) and (i < 2 or hi > lo)]
        if short:
            counts = ", ".join(f"{name} {hi - lo:,}" for (lo, hi), name
                               in zip(parts, names, strict=True))
            raise DataError(f"{self._where}: too few time steps for the {short[0]} part: a "
                            f"window of {self.window} and its target {self.horizon} "
                            f"step{'s' if self.horizon > 1 else ''} later need {need:,} "
                            f"steps inside one part, but the {cuts[-1]:,} steps split "
                            f"into {counts}; make window (or horizon) smaller, or that "
                            "part's fraction larger", key="window")
        return starts

    def load(self) -> LoadedData:
        """Every split's windows: float32 ``[n, window * columns]`` scaled inputs, and
        the targets (standardized, or class indices)."""
        out = []
        idx = np.arange(self.window)
        for starts in self.starts:
            x = self._values[starts[:, None] + idx].reshape(len(starts), self.features)
            y = self._y[self.target_index(starts)]
            out.append(Split(np.ascontiguousarray(x), self._encode(y)))
        return LoadedData(self.name, out[0], out[1], out[2], self.classes, self.task,
                          self.target_scale)

    def _encode(self, y: np.ndarray) -> np.ndarray:
        assert self.preprocess is not None
        return encoded(y, self.task, self.target_scale, self.preprocess.labels)


def _columns_of(data: Any, where: str) -> dict[str, np.ndarray]:
    """A DataFrame's or a mapping's columns as 1-D arrays of one length."""
    if _is_frame(data):
        cols = {str(c): data[c].to_numpy() for c in data.columns}
    elif isinstance(data, Mapping):
        cols = {str(k): np.asarray(v) for k, v in data.items()}
    else:
        raise DataError(f"{where}: a series is a pandas DataFrame or a mapping of column "
                        f"names to arrays, not {type(data).__name__}")
    if not cols:
        raise DataError(f"{where}: no columns", key="path")
    lengths = {len(v) if v.ndim == 1 else -1 for v in cols.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise DataError(f"{where}: the columns are not 1-D arrays of one length", key="path")
    if not next(iter(lengths)):
        raise DataError(f"{where}: no rows: nothing to learn from", key="path")
    return cols


def _fit_scale(values: np.ndarray, scale: str) -> tuple[np.ndarray, np.ndarray]:
    """(offset, spread) per column of the training steps ``values``."""
    k = values.shape[1]
    if scale == "none":
        return np.zeros(k), np.ones(k)
    if scale == "minmax":
        lo = values.min(0)
        span = values.max(0) - lo
        return lo, np.where(span == 0, 1.0, span)
    std = values.std(0)
    return values.mean(0), np.where(std == 0, 1.0, std)


def series_from_file(path: str | Path, target: str, **options: Any) -> SeriesDataset:
    """The time series of a ``.csv`` or ``.parquet`` file as a :class:`SeriesDataset`;
    ``options`` are its (``columns``, ``time``, ``window``, ...).  A message about a
    missing value names the CSV line.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = Path(f"{d}/s.csv").write_text("v\\n" + "\\n".join(map(str, range(50))))
    ...     series_from_file(f"{d}/s.csv", "v", window=5, test=0.2).rows
    (25, 5, 5)
    """
    p = Path(path)
    if p.suffix.lower() not in (".csv", ".parquet"):
        raise DataError(f"{p}: a series is a .csv or .parquet table, not "
                        f"{p.suffix or 'a file without a suffix'}", key="path")
    src = read_file(p, None, None)
    options.setdefault("name", p.stem)
    return SeriesDataset(src.frame, target, where=str(p), csv=src.csv, **options)


# -- a baseline ------------------------------------------------------------------------


@dataclass(frozen=True)
class ForecastError:
    """A forecast's error over a split's windows, in the target's own units."""

    mae: float
    rmse: float
    windows: int


def seasonal_naive(data: BaseDataset, season: int) -> dict[str, ForecastError]:
    """The seasonal-naive forecast's error on the valid and test windows of the series
    ``data`` (a :class:`SeriesDataset`, or a named series such as ``sunspots`` with
    its defaults): each target is forecast as the value one ``season`` earlier, or
    whole seasons earlier, the fewest that reach a step the window has seen
    (``y[t + h - season * ((h - 1) // season + 1)]`` from the window's last step ``t``,
    ``h`` the horizon).  A forecaster that does not beat it learned little.  Keys:
    ``valid``, and ``test`` when the test part has windows.

    >>> y = np.arange(60.0) % 5  # a season of 5 steps
    >>> err = seasonal_naive(SeriesDataset({"y": y}, "y", window=6, test=0.0), season=5)
    >>> err["valid"].mae, err["valid"].windows, sorted(err)
    (0.0, 6, ['valid'])
    """
    ds = data.configure() if not isinstance(data, SeriesDataset) else data
    if not isinstance(ds, SeriesDataset):
        raise DataError(f"seasonal_naive needs a time series, not {type(data).__name__}")
    if ds.task != "regression":
        raise DataError("seasonal_naive forecasts numbers: the series is a classification",
                        key="task")
    m = _positive("season", season)
    out: dict[str, ForecastError] = {}
    for name, starts in zip(("valid", "test"), ds.starts[1:], strict=True):
        if not len(starts):
            continue
        target = ds.target_index(starts)
        origin = target - ds.horizon
        seen = origin + ds.horizon - m * ((ds.horizon - 1) // m + 1)
        if seen.min() < 0:
            raise DataError(f"season {m} reaches before the series' first step from the "
                            f"{name} windows", key="season")
        # the target column as read: predictions are compared in its units
        err = ds.target_values(target).astype(np.float64) - \
            ds.target_values(seen).astype(np.float64)
        out[name] = ForecastError(float(np.mean(np.abs(err))),
                                  float(np.sqrt(np.mean(err ** 2))), len(starts))
    return out
