"""The rows a search trains, validates and tests on, for the user to see: :func:`split`.

A search splits its data set once, the same way each time (the seed and the rules of
:mod:`explore.datasets.split`, or a built-in set's fixed split), and trains on the
first ``dataset.train`` rows of the training split and validates on the first
``dataset.valid`` of the validation split where the space limits them.  :func:`split`
gives those rows as the user has them: a table's as DataFrames of its own columns
(not preprocessed), images as arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from explore.binding import bind
from explore.datasets import BaseDataset
from explore.datasets.source import Source
from explore.datasets.table import TableDataset, from_python
from explore.runner import TABLE_OPTIONS
from explore.space import Space, load_space, parse_space

SPLITS = ("train", "valid", "test")


class Part(NamedTuple):
    """Images of one split and their labels, as arrays (``x`` ``[n, ...]``, ``y`` ``[n]``)."""

    x: np.ndarray
    y: np.ndarray


class Splits(NamedTuple):
    """The train, valid and test rows: each a DataFrame (a table) or a :class:`Part`
    (images)."""

    train: Any
    valid: Any
    test: Any


def split(space: str | Path | Mapping[str, Any] | Space, data: Any = None,
          target: str | None = None) -> Splits:
    """The train, validation and test rows of ``space``'s data set exactly as a search
    of it uses them: the same split (seed, fractions, stratification, a built-in set's
    fixed split) and the ``dataset.train`` / ``dataset.valid`` row limits.  ``space``,
    ``data`` and ``target`` are as for :func:`explore.run` (a file or a dict; your own
    DataFrame or ``(X, y)`` arrays with the space's ``dataset:`` options applied).

    A table gives DataFrames: the feature columns the search used, as you have them
    (raw, before scaling and one-hot encoding), then the target column (``y`` for
    arrays), each row under its label in your data (its position, for arrays), in the
    order the search had them.  Images (a built-in set, or arrays of more than two
    dimensions) give :class:`Part` s of ``x`` and ``y`` arrays: a built-in set's as it
    holds them (digits' pixels as ``k / 16`` floats; :meth:`TrainedModel.predict
    <explore.trained.TrainedModel.predict>` takes those).

    Raises :class:`~explore.yamlio.SpaceError` (file, line and key at fault) for a bad
    space, :class:`~explore.datasets.DataError` for data that cannot be read or split.

    >>> train, valid, test = split({"dataset": {"name": "iris", "valid": 0.2, "test": 0.2},
    ...                             "budget": {"trials": 1, "rounds": 1, "memory": "1GB"}})
    >>> len(train), len(valid), len(test)
    (90, 30, 30)
    >>> list(train.columns)[-2:], sorted(set(test.y))
    (['petal width (cm)', 'y'], [0, 1, 2])
    """
    sp, options = _space(space, data is not None)
    given = from_python(data, target=target, **options) if data is not None else None
    bound = bind(sp, given)
    heads = dict(zip(SPLITS, sp.dataset.heads if sp.dataset is not None else (None, None),
                     strict=False))
    ds = bound.data
    if isinstance(ds, TableDataset):
        return Splits(*(_rows(ds, s, rows[:heads[name]] if heads.get(name) is not None
                              else rows)
                        for name, s, rows in ds._splits()))
    return _arrays(ds, heads)


def _space(space: Any, has_data: bool) -> tuple[Space, dict[str, Any]]:
    """The space, and its ``dataset:`` table options where the data comes from Python
    (they apply to it; the section's own source is replaced), as :func:`explore.run`
    reads them."""
    if isinstance(space, Space):
        sp = space
    elif isinstance(space, Mapping):
        raw = dict(space)
        section = raw.get("dataset")
        if has_data and isinstance(section, Mapping):
            raw["dataset"] = None
            sp = parse_space(raw)
            return sp, {k: v for k, v in section.items() if k in TABLE_OPTIONS}
        sp = parse_space(raw)
    else:
        sp = load_space(Path(space))
    options: dict[str, Any] = {}
    if has_data and sp.dataset is not None:
        options = {k: getattr(sp.dataset, k) for k in TABLE_OPTIONS
                   if getattr(sp.dataset, k, None)}
    return sp, options


def _rows(ds: TableDataset, s: Source, rows: np.ndarray) -> Any:
    """Rows ``rows`` of source ``s``: a DataFrame of the features the search used and
    the target, or images as a :class:`Part`."""
    import pandas as pd  # noqa: PLC0415 (30 MB that a run of images never needs)

    pre = ds.preprocess
    assert pre is not None
    target = ds.target or "y"
    if s.frame is not None:
        by_name = {str(c): c for c in s.frame.columns}
        frame = s.frame.iloc[rows][[by_name[c] for c in (*pre.columns, target)]]
        return frame
    assert s.x is not None and s.y is not None
    x, y = s.x[rows], s.y[rows]
    if x.ndim > 2:
        return Part(np.asarray(x), np.asarray(y))
    out = pd.DataFrame(np.asarray(x), columns=list(pre.columns), index=rows)
    out[target] = np.asarray(y)
    return out


def _arrays(ds: BaseDataset, heads: dict[str, int | None]) -> Splits:
    """A built-in set's splits as it loads them, each as a :class:`Part`."""
    data = ds.load()
    parts = []
    for name in SPLITS:
        s = getattr(data, name)
        n = heads.get(name)
        parts.append(Part(s.x[:n] if n is not None else s.x, s.y[:n] if n is not None else s.y))
    return Splits(*parts)
