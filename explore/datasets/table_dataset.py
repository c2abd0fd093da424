"""The tabular data set, :class:`TableDataset`: a table (CSV, Parquet, a pandas
DataFrame) or arrays (``.npz``, ``.npy`` pairs, numpy arrays) read and checked once
when it is made, split and its :class:`Preprocess` fitted on the training split; then
read again, a chunk of rows at a time, each time a run loads it.  Its makers from a
file, from Python data and from a search space's section are :mod:`.table`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from explore.datasets._base import TASKS, BaseDataset, Empty, LoadedData, Split, plain_empty
from explore.datasets.columns import (
    SCALES,
    check_columns,
    check_encoded_width,
    chunk_rows,
    fit_scaling,
    input_columns,
    layout_of,
    numeric_rows,
    train_categories,
)
from explore.datasets.errors import DataError
from explore.datasets.missing import (
    Gaps,
    MissingReport,
    check_options,
    fit_numeric,
    most_frequent_category,
    refuse,
    scan,
)
from explore.datasets.preprocess import Preprocess, _plain
from explore.datasets.source import Source, Table, as_source, require_rows
from explore.datasets.split import split_rows
from explore.datasets.target import (
    check_classes_seen,
    check_target,
    class_codes,
    infer_task,
    sorted_unique,
)


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
    inferred when None (:func:`~explore.datasets.target.infer_task`); ``seed`` fixes
    the split.  ``missing`` says what a missing value does: ``error`` (refused, every
    column at fault in one message), ``drop`` (its row is dropped before the split) or
    ``impute`` (filled with the training split's ``impute`` statistic, ``median``,
    ``mean`` or ``most_frequent``, or a category's most frequent value; a row without
    a target is dropped): see :mod:`explore.datasets.missing`.

    Attributes besides :class:`BaseDataset`'s: ``name``, ``rows`` (train, valid,
    test counts), ``preprocess``, ``target``, ``where`` (the source, for messages) and
    ``missing_report`` (what ``missing`` dropped and filled).

    >>> ds = TableDataset((np.arange(20.0).reshape(10, 2), np.arange(10.0) / 3),
    ...                   valid=0.2, test=0.2, seed=1)
    >>> ds.task, ds.outputs, ds.rows, ds.preprocess.numeric
    ('regression', 1, (6, 2, 2), ('x0', 'x1'))
    >>> x = np.arange(20.0).reshape(10, 2)
    >>> x[3, 0] = np.nan
    >>> str(TableDataset((x, np.arange(10.0) / 3), missing="drop").missing_report)
    'dropped 1 of 10 rows with a missing value'
    """

    def __init__(self, data: Table, target: str | None = None, *,
                 features: Sequence[str] | None = None, categorical: Sequence[str] = (),
                 valid: float | Table = 0.2, test: float | Table = 0.0,
                 scale: str = "standard", task: str | None = None, seed: int = 0,
                 name: str = "table", missing: str = "error",
                 impute: str = "median") -> None:
        def read() -> list[Source | None]:
            return [as_source(data, "the data"),
                    None if is_fraction(valid) else as_source(valid, "the validation data"),
                    None if is_fraction(test) else as_source(test, "the test data")]

        self._setup(read, target, features, categorical, valid, test, scale, task, seed,
                    name, missing, impute)

    @classmethod
    def _from_reader(cls, read: Callable[[], list[Source | None]], target: str | None,
                     features: Sequence[str] | None, categorical: Sequence[str],
                     valid: float | Any, test: float | Any, scale: str, task: str | None,
                     seed: int, name: str, missing: str = "error",
                     impute: str = "median") -> TableDataset:
        self = cls.__new__(cls)
        self._setup(read, target, features, categorical, valid, test, scale, task, seed,
                    name, missing, impute)
        return self

    # -- reading and checking, once --------------------------------------------------------

    def _setup(self, read: Callable[[], list[Source | None]], target: str | None,
               features: Sequence[str] | None, categorical: Sequence[str], valid: Any,
               test: Any, scale: str, task: str | None, seed: int, name: str,
               missing: str, impute: str) -> None:
        # one column's name given as text is that column, not its letters
        features = [features] if isinstance(features, str) else features
        categorical = [categorical] if isinstance(categorical, str) else categorical
        if scale not in SCALES:
            raise DataError(f"scale {scale!r}: one of {', '.join(SCALES)}", key="scale")
        if task is not None and task not in TASKS:
            raise DataError(f"task {task!r}: one of {', '.join(TASKS)}", key="task")
        check_options(missing, impute)
        for opt, v in (("valid", valid), ("test", test)):
            if is_fraction(v) and not (0 <= v < 1):
                raise DataError(f"{opt}: a fraction in [0, 1), got {v}", key=opt)
        if is_fraction(valid) and valid <= 0:
            raise DataError("valid: the validation split needs rows (a fraction above 0)",
                            key="valid")
        self._read, self.name, self.seed = read, name, seed
        self._fractions = (valid if is_fraction(valid) else 0.0,
                           test if is_fraction(test) else 0.0)
        self.scaling = scale
        self._missing = missing
        self._int_target = False
        sources = read()
        main = sources[0]
        assert main is not None
        self.where = main.where
        for src, key in zip(sources, (None, "valid", "test"), strict=True):
            if src is not None:
                require_rows(src, key)
        layout = layout_of(main, target, features, categorical)
        self._lay = layout
        for s in sources:
            if s is not None:
                check_columns(s, layout)
        gaps = [None if s is None else scan(s, layout) for s in sources]
        refuse(gaps, missing)
        kept = self._kept(sources, gaps)
        self._kept_counts = tuple(None if k is None else len(k) for k in kept)
        y_main = self._y(main, kept[0])
        self.task = task or infer_task(y_main)
        if self.task == "classification" and y_main.dtype.kind == "f" and \
                gaps[0] is not None and gaps[0].target.missing and \
                np.all(np.mod(y_main, 1) == 0):
            # integer classes that pandas read as floats for a missing value
            self._int_target = True
            y_main = y_main.astype(np.int64)
        check_target(main.where, self._tname(), y_main, self.task)
        codes_main = None
        if self.task == "classification":
            every = sorted_unique(y_main)
            codes_main = class_codes(y_main, every)
            if len(every) < 2:
                raise DataError(f"{main.where}: the target {self._tname()} has one class "
                                f"({_plain(every[0])!r}): nothing to classify; is it the "
                                f"right column?", key="target")
        parts = split_rows(len(y_main), *self._fractions, seed=seed, classes=codes_main)
        train, valid_rows, test_rows = (p if kept[0] is None else kept[0][p] for p in parts)
        # the fitted transformation, from the training rows only
        self.target = layout.target
        categories = tuple(train_categories(main, layout, c, train)
                           for c in layout.categorical)
        check_encoded_width(main.where, layout, categories)
        fill: tuple[float, ...] = ()
        fill_categories: tuple[Any, ...] = ()
        if missing == "impute":
            fill = fit_numeric(main, layout, train, impute)
            fill_categories = tuple(
                most_frequent_category(main.where, c, self._column(main, c)[train], cats)
                for c, cats in zip(layout.categorical, categories, strict=True))
        offset, spread = fit_scaling(main, train, layout, scale, fill)
        labels: tuple[Any, ...] = ()
        target_scale = None
        y_train = self._y(main, train)
        splits = [(main, train), (main, valid_rows), (main, test_rows)]
        for i in (1, 2):
            s = sources[i]
            if s is not None:
                splits[i] = (s, kept[i] if kept[i] is not None else np.arange(s.n))
        if self.task == "classification":
            labels = tuple(_plain(v) for v in sorted_unique(y_train))
            for s, rows in splits[1:]:
                check_classes_seen(s.where, self._y(s, rows), labels)
        else:
            mean = float(np.mean(y_train, dtype=np.float64))
            std = float(np.std(y_train, dtype=np.float64)) or 1.0
            target_scale = (mean, std)
        columns = tuple(c for c in input_columns(main, layout))
        self.preprocess = Preprocess(
            columns=columns, numeric=tuple(layout.numeric), offset=offset, scale=spread,
            categorical=tuple(layout.categorical), categories=categories, task=self.task,
            labels=labels, target_scale=target_scale, scaling=scale,
            impute=impute if missing == "impute" else None, fill=fill,
            fill_categories=fill_categories)
        self.missing_report = self._report(sources, gaps, impute)
        self.target_scale = target_scale
        self.classes = len(labels)
        self.features = self.preprocess.features
        counts = [len(rows) for _, rows in splits]
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

    def _kept(self, sources: list[Source | None], gaps: list[Gaps | None]
              ) -> list[np.ndarray | None]:
        """The rows of each source that ``missing`` keeps (None: all of them); a source
        left without any is refused."""
        if self._missing == "error":
            return [None] * len(sources)
        kept = [None if g is None else g.kept(self._missing) for g in gaps]
        for s, k, key in zip(sources, kept, (None, "valid", "test"), strict=True):
            if s is not None and k is not None and not len(k):
                why = "a missing value" if self._missing == "drop" else "no target"
                raise DataError(f"{s.where}: every one of its {s.n:,} rows has {why}: "
                                f"missing: {self._missing} leaves nothing to learn from",
                                key=key or "missing")
        return kept

    def _report(self, sources: list[Source | None], gaps: list[Gaps | None],
                impute: str) -> MissingReport:
        assert self.preprocess is not None
        p = self.preprocess
        found = [g for g in gaps if g is not None]
        rows = sum(s.n for s in sources if s is not None)
        if self._missing == "error":
            return MissingReport("error", rows, 0)
        dropped = sum(g.dropped(self._missing) for g in found)
        if self._missing == "drop":
            return MissingReport("drop", rows, dropped)
        values: dict[str, Any] = {**dict(zip(p.numeric, p.fill, strict=True)),
                                  **dict(zip(p.categorical, p.fill_categories, strict=True))}
        imputed: dict[str, int] = {}
        for c in p.columns:
            k = sum(g.columns[c].fillable for g in found if c in g.columns)
            if k:
                imputed[c] = k
        return MissingReport("impute", rows, dropped, imputed,
                             {c: values[c] for c in imputed}, impute)

    def _tname(self) -> str:
        return repr(self._lay.target) if self._lay.target else "y"

    def _target(self, s: Source) -> np.ndarray:
        if s.frame is None:
            assert s.y is not None
            return np.asarray(s.y)
        assert self._lay.target is not None
        return self._column(s, self._lay.target)

    def _column(self, s: Source, name: str) -> np.ndarray:
        assert s.frame is not None
        return s.frame[{str(c): c for c in s.frame.columns}[name]].to_numpy()

    def _y(self, s: Source, rows: np.ndarray | None) -> np.ndarray:
        """The target of ``rows`` of ``s`` (None: all of them)."""
        y = self._target(s)
        y = y if rows is None else y[rows]
        return y.astype(np.int64) if self._int_target else y

    # -- loading, each time from the source ------------------------------------------------------

    def _splits(self) -> Iterator[tuple[str, Source, np.ndarray]]:
        """Read the data again and split it as when the dataset was made."""
        sources = self._read()
        main = sources[0]
        assert main is not None
        if self._missing == "error":
            kept: list[np.ndarray | None] = [None] * len(sources)
        else:  # only the target decides which rows impute keeps
            kept = self._kept(sources, [
                None if s is None else scan(s, self._lay, features=self._missing == "drop")
                for s in sources])
        counts = tuple(None if k is None else len(k) for k in kept)
        if counts != self._kept_counts:
            raise DataError(f"{main.where} changed since it was read")
        y = self._y(main, kept[0])
        codes = class_codes(y, sorted_unique(y)) if self.task == "classification" else None
        parts = split_rows(len(y), *self._fractions, seed=self.seed, classes=codes)
        rng = np.random.default_rng(self.seed + 1)
        for i, name in enumerate(("train", "valid", "test")):
            own = sources[i] if i else None
            if own is None:
                yield name, main, parts[i] if kept[0] is None else kept[0][parts[i]]
                continue
            rows = kept[i]
            count = own.n if rows is None else len(rows)
            if count != self.rows[i]:
                raise DataError(f"{own.where} changed since it was read")
            order = rng.permutation(count)
            yield name, own, order if rows is None else rows[order]

    def load(self) -> LoadedData:
        """Every split, float32 features (uint8 pixels converted back to float32)."""
        data = self.load_compact(None, None, plain_empty, test=True)
        if self.pixel_scale is None:
            return data
        tr, va, te = (Split(s.x.astype(np.float32) * np.float32(self.pixel_scale), s.y)
                      for s in (data.train, data.valid, data.test))
        return LoadedData(self.name, tr, va, te, self.classes, self.task, self.target_scale)

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty, test: bool = False) -> LoadedData:
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
            y[...] = self._encode_target(self._y(s, rows))
            out[name] = Split(x, y)
        return LoadedData(self.name, out["train"], out["valid"], out["test"], self.classes,
                          self.task, self.target_scale)

    def _write(self, s: Source, rows: np.ndarray, out: np.ndarray) -> None:
        assert self.preprocess is not None
        lay = self._lay
        step = chunk_rows(max(1, self.features))
        buf = np.empty((min(step, len(rows)), self.features), np.float32)
        for start in range(0, len(rows), step):
            idx = rows[start:start + step]
            order = np.argsort(idx, kind="stable")  # read in file order (memory maps)
            got = idx[order]
            if self.pixel_scale is not None:
                assert s.x is not None
                out[start + order] = s.x[got].reshape(len(got), -1)
                continue
            num = numeric_rows(s, lay, got)
            cats = [self._column(s, c)[got] for c in lay.categorical]
            part = buf[:len(got)]
            self.preprocess.transform_into(num, cats, part)
            out[start + order] = part

    def _encode_target(self, y: np.ndarray) -> np.ndarray:
        assert self.preprocess is not None
        if self.task == "regression":
            mean, std = self.target_scale or (0.0, 1.0)
            return ((np.asarray(y, np.float64) - mean) / std).astype(np.float32)
        codes = class_codes(y, np.asarray(self.preprocess.labels, dtype=object
                                           if any(isinstance(v, str) for v in
                                                  self.preprocess.labels) else None))
        return codes


def is_fraction(v: Any) -> bool:
    """A split given as a fraction of the rows (not as a table of its own)."""
    return isinstance(v, float | int) and not isinstance(v, bool)

