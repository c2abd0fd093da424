"""Missing and infinite values in a table: found (:func:`scan`), reported all at once
(:func:`refuse`), dropped, or imputed from the training split (:func:`fit_numeric`,
:func:`most_frequent_category`).

The ``dataset.missing`` option says what a missing value does:

- ``error`` (the default): the table is refused, one message naming every column with
  missing values, how many, and the first few rows (the DataFrame's index labels as
  pandas shows them; for a CSV file also its line, the header being line 1);
- ``drop``: rows with a missing feature or target are dropped before the split;
- ``impute``: a missing numeric feature takes the training split's ``impute`` statistic
  of its column (``median``, the default, ``mean`` or ``most_frequent``, as
  scikit-learn's ``SimpleImputer`` names them), a missing categorical one the training
  split's most frequent category; rows without a target are dropped (a target is never
  imputed).

A missing value is what pandas counts as one (NaN, None, ``pd.NA``, ``NaT``; an empty
CSV field is read as NaN).  Infinities (and values beyond float32's range, which would
become infinities where the models compute) are refused whatever ``missing`` says: they
are values, not gaps; replace them with NaN to have them treated as missing.

>>> import pandas as pd
>>> from explore.datasets.columns import Layout
>>> from explore.datasets.source import Source
>>> frame = pd.DataFrame({"a": [1.0, None, 3.0], "y": [0, 1, 0]}, index=[10, 20, 30])
>>> gaps = scan(Source("the data", frame=frame), Layout("y", ["a"], []))
>>> gaps.columns["a"].missing, gaps.columns["a"].missing_at, gaps.dropped("drop")
(1, [1], 1)
>>> refuse([gaps], "error")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
explore.datasets.errors.DataError: the data: missing values in 1 column (1 of 3 rows):
  'a': 1 missing, at index 20
set dataset.missing: drop ...
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from explore.datasets.columns import Layout, chunk_rows, input_columns, numeric_rows
from explore.datasets.errors import DataError
from explore.datasets.preprocess import _pd, _plain
from explore.datasets.source import Source

MISSING = ("error", "drop", "impute")
IMPUTE = ("mean", "median", "most_frequent")
SHOW = 5  # rows a message names per column
SHOW_COLUMNS = 30  # columns a message details; the rest are counted
# float64 values of the training split read at once to fit a median or most frequent
# value (a few columns at a time for a large table)
FIT_VALUES = 8 << 20
FIX_MISSING = ("set dataset.missing: drop (drop those rows) or impute (fill them from the "
               "training split: a numeric column's median, or its mean or most_frequent "
               "value with impute:, a category's most frequent one; a row without a "
               "target is dropped, never imputed)")
FIX_INFINITE = ("values must be finite in float32, the type models train in: infinities and "
                "values beyond +-3.4e38 are refused whatever dataset.missing says; replace "
                "them with NaN to have them treated as missing values")
F32_MAX = float(np.finfo(np.float32).max)


def check_options(missing: str, impute: str) -> None:
    """``missing`` and ``impute`` are among :data:`MISSING` and :data:`IMPUTE`."""
    if missing not in MISSING:
        raise DataError(f"missing {missing!r}: one of {', '.join(MISSING)}", key="missing")
    if impute not in IMPUTE:
        raise DataError(f"impute {impute!r}: one of {', '.join(IMPUTE)}", key="impute")


@dataclass
class ColumnGaps:
    """The missing and infinite values of one column (the first :data:`SHOW` rows of
    each, as positions in the source)."""

    missing: int = 0
    missing_at: list[int] = field(default_factory=list)
    # missing in rows whose target is there: the values ``impute`` fills
    fillable: int = 0
    infinite: int = 0
    infinite_at: list[int] = field(default_factory=list)

    def add(self, missing: np.ndarray, infinite: np.ndarray | None, start: int,
            target_gap: np.ndarray) -> None:
        """Count a block of rows (boolean flags) that begins at row ``start``."""
        k = int(missing.sum())
        if k:
            self.missing += k
            self.fillable += int((missing & ~target_gap).sum())
            if len(self.missing_at) < SHOW:
                self.missing_at += (np.flatnonzero(missing)[:SHOW - len(self.missing_at)]
                                    + start).tolist()
        if infinite is not None and infinite.any():
            self.infinite += int(infinite.sum())
            if len(self.infinite_at) < SHOW:
                self.infinite_at += (np.flatnonzero(infinite)[:SHOW - len(self.infinite_at)]
                                     + start).tolist()


@dataclass
class Gaps:
    """Where one source's values are missing or infinite."""

    source: Source
    target_name: str | None  # the target column (None: arrays' y)
    columns: dict[str, ColumnGaps]  # the features with a gap, in the source's order
    target: ColumnGaps
    feature_gap: np.ndarray  # bool [n]: a feature is missing in the row
    target_gap: np.ndarray  # bool [n]: the target is missing in the row

    def _gap(self, missing: str) -> np.ndarray:
        return self.target_gap | self.feature_gap if missing == "drop" else self.target_gap

    def kept(self, missing: str) -> np.ndarray | None:
        """Positions of the rows that ``missing`` keeps (None: every row): ``drop``
        drops the rows with a missing feature or target, ``impute`` those without a
        target."""
        gap = self._gap(missing)
        return np.flatnonzero(~gap) if gap.any() else None

    def dropped(self, missing: str) -> int:
        """Rows that ``missing`` drops."""
        return int(self._gap(missing).sum())

    def named(self) -> list[tuple[str, ColumnGaps]]:
        """(name for a message, gaps) of each column with a gap, the target last."""
        out = [(repr(c), g) for c, g in self.columns.items()]
        if self.target.missing or self.target.infinite:
            name = f"target {self.target_name!r}" if self.target_name else "target y"
            out.append((name, self.target))
        return out


def scan(s: Source, layout: Layout, features: bool = True) -> Gaps:
    """The missing and infinite values of the source ``s``: its features (the columns
    of ``layout``; not with ``features`` false) and its target, a chunk of rows at a
    time."""
    n = s.n
    t_missing, t_infinite = _flags(_target_values(s, layout))
    feature_gap = np.zeros(n, bool)
    columns = {c: ColumnGaps() for c in input_columns(s, layout)}
    names = layout.numeric
    step = chunk_rows(len(names))
    if features and s.frame is None:
        assert s.x is not None
        if s.x.dtype.kind in "fc":  # integers have no NaN
            for start in range(0, n, step):
                block = np.asarray(s.x[start:start + step])
                _count(block.reshape(len(block), -1), names, columns, start, t_missing,
                       feature_gap)
    elif features and s.frame is not None:
        col = {str(c): c for c in s.frame.columns}
        for start in range(0, n, step) if names else ():
            rows = np.arange(start, min(start + step, n))
            _count(numeric_rows(s, layout, rows), names, columns, start, t_missing,
                   feature_gap)
        for c in layout.categorical:
            m = s.frame[col[c]].isna().to_numpy(bool)
            columns[c].add(m, None, 0, t_missing)
            feature_gap |= m
    target = ColumnGaps()
    target.add(t_missing, t_infinite, 0, np.zeros(n, bool))
    return Gaps(s, layout.target, {k: v for k, v in columns.items() if v.missing or v.infinite},
                target, feature_gap, t_missing)


def _target_values(s: Source, layout: Layout) -> np.ndarray:
    if s.frame is None:
        assert s.y is not None
        return np.asarray(s.y)
    assert layout.target is not None
    return s.frame[{str(c): c for c in s.frame.columns}[layout.target]].to_numpy()


def _infinite(v: np.ndarray) -> np.ndarray:
    """Infinite in float32, the type the models train in: infinities, and finite float64
    values beyond float32's largest (1e39 would become an infinity there)."""
    return np.abs(v) > F32_MAX  # NaN compares False: it is missing, not infinite


def _flags(y: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(missing, infinite) flags of values ``y``; None where none can be infinite."""
    if y.dtype.kind in "fc":
        return np.isnan(y), _infinite(y)
    if y.dtype == object:
        return np.asarray(_pd().isna(y), bool), None
    return np.zeros(len(y), bool), None


def _count(block: np.ndarray, names: Sequence[str], columns: dict[str, ColumnGaps],
           start: int, t_missing: np.ndarray, feature_gap: np.ndarray) -> None:
    """Count the gaps of a float64 block of numeric features."""
    if block.dtype.kind not in "fc":
        return
    nan, inf = np.isnan(block), _infinite(block)
    if not (nan.any() or inf.any()):
        return
    stop = start + len(block)
    feature_gap[start:stop] |= nan.any(1)
    for j in np.flatnonzero(nan.any(0) | inf.any(0)):
        columns[names[int(j)]].add(nan[:, j], inf[:, j], start, t_missing[start:stop])


# -- the message --------------------------------------------------------------------------


def refuse(gaps: Sequence[Gaps | None], missing: str) -> None:
    """Raise one :class:`DataError` naming every infinite value of every source, and
    every missing value when ``missing`` is ``error``; nothing if there is none."""
    found = [g for g in gaps if g is not None]
    show = {what: any(getattr(c, what) for g in found for _, c in g.named())
            for what in ("missing", "infinite")}
    show["missing"] &= missing == "error"
    if not any(show.values()):
        return
    parts = [_section(g, what) for g in found for what in ("missing", "infinite")
             if show[what] and any(getattr(c, what) for _, c in g.named())]
    if show["missing"]:
        parts.append(FIX_MISSING)
    if show["infinite"]:
        parts.append(FIX_INFINITE)
    raise DataError("\n".join(parts), key="missing" if show["missing"] else None)


def _section(g: Gaps, what: str) -> str:
    """The lines of one source's ``what`` (missing or infinite) values."""
    s = g.source
    bad = [(name, c) for name, c in g.named() if getattr(c, what)]
    shown = bad[:SHOW_COLUMNS]
    lines_of = _line_finder(s, [p for _, c in shown for p in getattr(c, f"{what}_at")])
    kind = "infinite (in float32)" if what == "infinite" else what
    head = f"{s.where}: {kind} values in {len(bad)} column{'s' * (len(bad) > 1)}"
    if what == "missing":
        rows = int((g.feature_gap | g.target_gap).sum())
        head += f" ({rows:,} of {s.n:,} rows)"
    out = [head + ":"]
    for name, c in shown:
        count = getattr(c, what)
        out.append(f"  {name}: {count:,} {what}, at "
                   f"{_labels(s, getattr(c, f'{what}_at'), count, lines_of)}")
    if len(bad) > SHOW_COLUMNS:
        out.append(f"  ... and {len(bad) - SHOW_COLUMNS:,} more columns")
    return "\n".join(out)


def _labels(s: Source, at: list[int], count: int, lines_of: dict[int, int]) -> str:
    more = ", ..." if count > len(at) else ""
    if s.frame is None:  # arrays: numpy's 0-based positions
        return f"row{'s' if len(at) > 1 else ''} " + ", ".join(map(str, at)) + more
    index = s.frame.index
    text = "index " + ", ".join(str(_plain(index[p])) for p in at) + more
    if lines_of:
        lines = [str(lines_of[p]) for p in at if p in lines_of]
        text += f" (line{'s' if len(lines) > 1 else ''} " + ", ".join(lines) + more + ")"
    return text


def _line_finder(s: Source, positions: list[int]) -> dict[int, int]:
    """The line of the CSV file ``s`` was read from at which each row of ``positions``
    begins (the header is line 1); empty for any other source."""
    if s.csv is None or not positions:
        return {}
    return csv_lines(s.csv, positions)


def csv_lines(path: Path, positions: Sequence[int]) -> dict[int, int]:
    """The line of the CSV file ``path`` at which each data row of ``positions``
    (0-based, as pandas reads them: blank lines skipped, a quoted field may span
    lines) begins; the header is line 1.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "t.csv"
    ...     _ = p.write_text('a,b\\n1,"x\\ny"\\n\\n2,z\\n')
    ...     csv_lines(p, [0, 1])
    {0: 2, 1: 5}
    """
    want = set(positions)
    last = max(want)
    out: dict[int, int] = {}
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            next(reader, None)
            start, row = reader.line_num + 1, -1
            for record in reader:
                if record:  # pandas skips blank lines
                    row += 1
                    if row in want:
                        out[row] = start
                    if row >= last:
                        break
                start = reader.line_num + 1
    except (OSError, csv.Error):
        return {}  # the message goes without lines
    return out


# -- filling ------------------------------------------------------------------------------


def fit_numeric(s: Source, layout: Layout, train: np.ndarray, strategy: str
                ) -> tuple[float, ...]:
    """The value each numeric feature's missing values take: the ``strategy``
    (``mean``, ``median`` or ``most_frequent``, the smallest of equally frequent
    values) of its values in the ``train`` rows; a column without any there is
    refused."""
    k = len(layout.numeric)
    if not k:
        return ()
    rows = np.sort(train)
    width = max(1, FIT_VALUES // max(1, len(rows)))
    fill: list[float] = []
    for lo in range(0, k, width):
        hi = min(k, lo + width)
        block = np.empty((len(rows), hi - lo))
        step = chunk_rows(k)
        for i in range(0, len(rows), step):
            block[i:i + step] = numeric_rows(s, layout, rows[i:i + step])[:, lo:hi]
        for j in range(hi - lo):
            v = block[:, j]
            v = v[~np.isnan(v)]
            if not len(v):
                raise DataError(f"{s.where}: the column {layout.numeric[lo + j]!r} has no "
                                "value in the training split to impute from; leave it out "
                                "of the features", key="features")
            if strategy == "mean":
                fill.append(float(np.mean(v)))
            elif strategy == "median":
                fill.append(float(np.median(v)))
            else:
                values, counts = np.unique(v, return_counts=True)
                fill.append(float(values[np.argmax(counts)]))
    return tuple(fill)


def most_frequent_category(where: str, column: str, values: np.ndarray,
                           categories: tuple[Any, ...]) -> Any:
    """The most frequent of the training ``values`` (missing ones left out) of a
    categorical ``column``, as one of its ``categories`` (ties: the first of them)."""
    if not categories:
        raise DataError(f"{where}: the categorical column {column!r} has no value in the "
                        "training split to impute from; leave it out of the features",
                        key="categorical")
    values = values[~np.asarray(_pd().isna(values), bool)]
    if isinstance(categories[0], str):
        values = values.astype(str)
    codes = _pd().Index(list(categories)).get_indexer(values)
    counts = np.bincount(codes[codes >= 0], minlength=len(categories))
    return categories[int(np.argmax(counts))]


@dataclass(frozen=True)
class MissingReport:
    """What ``dataset.missing`` did to a data set: rows dropped (of those read) and,
    with ``impute``, the values filled per column (in every split) and what with.
    ``str`` is one line for a run's output; :meth:`to_dict` plain JSON values.

    >>> print(MissingReport("impute", 240, 1, {"spend": 12}, {"spend": 49.5},
    ...                     "median"))
    dropped 1 of 240 rows without a target; imputed 12 values: 'spend' 12 (median 49.5)
    """

    missing: str  # error, drop or impute
    rows: int  # rows read, in every source
    dropped: int
    imputed: dict[str, int] = field(default_factory=dict)  # values filled, per column
    fill: dict[str, Any] = field(default_factory=dict)  # what with, per column
    impute: str | None = None  # the numeric strategy (impute)

    def __str__(self) -> str:
        if not self.dropped and not self.imputed:
            return "no missing values"
        parts = []
        if self.dropped:
            why = "with a missing value" if self.missing == "drop" else "without a target"
            parts.append(f"dropped {self.dropped:,} of {self.rows:,} rows {why}")
        if self.imputed:
            each = ", ".join(
                f"{c!r} {k:,} ({self._how(c)})" for c, k in self.imputed.items())
            parts.append(f"imputed {sum(self.imputed.values()):,} values: {each}")
        return "; ".join(parts)

    def _how(self, column: str) -> str:
        v = self.fill[column]
        if isinstance(v, float):  # a numeric column's (a category is text or an integer)
            return f"{(self.impute or 'median').replace('_', ' ')} {v:.6g}"
        return f"most frequent {v!r}"

    def to_dict(self) -> dict[str, Any]:
        return {"missing": self.missing, "rows": self.rows, "dropped": self.dropped,
                "imputed": dict(self.imputed),
                "fill": {c: _plain(v) for c, v in self.fill.items()},
                "impute": self.impute}
