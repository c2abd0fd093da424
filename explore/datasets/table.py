"""Users' own data: tables (CSV, Parquet, a pandas DataFrame) and arrays (``.npz``,
``.npy`` pairs, numpy arrays), split, preprocessed and checked.

A :class:`TableDataset` reads its data once when it is made, checks it (a clear
:class:`DataError` naming the file, column and row at fault), splits it (stratified
for classification, reproducible from ``seed``) and fits a :class:`Preprocess` on the
training split only: missing values imputed if asked (``missing: impute``; or their
rows dropped, ``missing: drop``; by default refused), numeric features scaled
(``standard``, ``minmax`` or ``none``), categorical ones one-hot encoded with the
categories seen in training.  It then keeps only what it learned (the preprocessing,
the counts) and reads the data again when the run loads it
(:meth:`TableDataset.load_compact`), transforming a chunk of rows at a time straight
into the run's shared arrays, so the scheduler never holds the table for the length
of a run.  ``.npy`` features are memory-mapped.

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

This module makes one: from a file (:func:`from_file`), from data held in Python
(:func:`from_python`), or as a search space's ``dataset:`` section names it
(:func:`resolve`).  The data set itself is :mod:`~explore.datasets.table_dataset`'s,
and its steps live beside it: reading files (:mod:`~explore.datasets.data_files`)
into a :class:`~explore.datasets.source.Source`, the columns' layout, checks and
scaling (:mod:`~explore.datasets.columns`), missing and infinite values
(:mod:`~explore.datasets.missing`), the target and the task it implies when ``task``
is not given (:mod:`~explore.datasets.target`), and the split
(:mod:`~explore.datasets.split`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from explore.datasets._base import BaseDataset, get
from explore.datasets.data_files import read_file, read_pair
from explore.datasets.errors import DataError, listing
from explore.datasets.preprocess import Preprocess, _is_frame
from explore.datasets.sequences import sequences_from_file
from explore.datasets.series import series_from_file
from explore.datasets.source import Source, Table
from explore.datasets.table_dataset import TableDataset, is_fraction

# Preprocess is also imported from here (explore.trained).
__all__ = ["DataSection", "Preprocess", "TableDataset", "from_file", "from_python", "resolve"]


class DataSection(Protocol):
    """What :func:`resolve` reads: the search space's ``dataset:`` section
    (:class:`explore.space.DatasetSection`)."""

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

    @property
    def missing(self) -> str | None: ...

    @property
    def impute(self) -> str | None: ...


def from_file(path: str | Path | None = None, target: str | None = None, *,
              x: str | Path | None = None, y: str | Path | None = None,
              features: Sequence[str] | None = None, categorical: Sequence[str] = (),
              valid: float | str | Path = 0.2, test: float | str | Path = 0.0,
              scale: str = "standard", task: str | None = None, seed: int = 0,
              name: str | None = None, missing: str = "error",
              impute: str = "median") -> TableDataset:
    """A data file as a :class:`TableDataset`: ``path`` to a ``.csv``, ``.parquet`` or
    ``.npz`` (``target`` names a column or an array; an ``.npz``'s features are its
    one other array, or ``features: [name]``), or ``x`` and ``y`` ``.npy`` files
    (memory-mapped: a large one is read a chunk at a time).  ``valid`` and ``test`` are
    fractions or files of the same format; ``missing`` and ``impute`` say what a
    missing value does (see :class:`TableDataset`).  Raises :class:`DataError`.

    >>> import tempfile
    >>> import numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     np.save(f"{d}/x.npy", np.arange(40.0).reshape(20, 2))
    ...     np.save(f"{d}/y.npy", np.array([0, 1] * 10))
    ...     ds = from_file(x=f"{d}/x.npy", y=f"{d}/y.npy", valid=0.25)
    >>> ds.rows, ds.classes
    ((15, 5, 0), 2)
    """
    if (path is None) == (x is None or y is None) or (x is None) != (y is None):
        raise DataError("give either path (a .csv, .parquet or .npz) or x and y (.npy files)",
                        key="path")
    names = (target, features)  # columns, or for an .npz the arrays to read
    if path is not None:
        main = Path(path)

        def first() -> Source:
            return read_file(main, *names)
    else:
        assert x is not None and y is not None
        xp, yp = Path(x), Path(y)

        def first() -> Source:
            return read_pair(xp, yp)

    def other(v: Any, key: str) -> Source | None:
        if is_fraction(v):
            return None
        p = Path(v)
        if path is None:  # arrays: a split of its own is an .npz of the same arrays
            return read_file(p, None, None, key=key)
        return read_file(p, *names, key=key)

    def read() -> list[Source | None]:
        return [first(), other(valid, "valid"), other(test, "test")]

    label = name or (Path(path).stem if path is not None else Path(str(x)).stem)
    if path is not None and Path(path).suffix.lower() == ".npz":
        target = None  # the arrays are already chosen
        features = None
    return TableDataset._from_reader(read, target, features, categorical, valid, test, scale,
                                     task, seed, label, missing, impute)


def from_python(data: Table, target: str | None = None, **options: Any) -> TableDataset:
    """A :class:`TableDataset` of data held in Python: a DataFrame (``target`` names a
    column) or a pair ``(X, y)`` of arrays or lists; ``options`` are the
    :class:`TableDataset` ones (``features``, ``categorical``, ``valid``, ``test``,
    ``scale``, ``task``, ``seed``, ``name``, ``missing``, ``impute``).  The data is
    referred to, not copied: do not change it while a run uses it.

    >>> ds = from_python(([[0.0], [1.0], [2.0], [3.0], [4.0]], ["a", "b", "a", "b", "a"]),
    ...                  valid=0.2)
    >>> ds.classes, ds.preprocess.labels
    (2, ('a', 'b'))
    """
    if _is_frame(data) and target is None:
        raise DataError(f"name the target column: target=...; columns: "
                        f"{listing([str(c) for c in data.columns])}", key="target")
    return TableDataset(data, target, **options)


def resolve(section: DataSection) -> BaseDataset:
    """The data set a search space's ``dataset:`` section names: a registered one by
    ``name`` (configured with the section's options where it takes them: the table
    ones, and a named series' ``window``, ``horizon``, ``stride``), or a file by
    ``kind``: a table (:func:`from_file`; no kind), a time series
    (:func:`~explore.datasets.series.series_from_file`) or sequences
    (:func:`~explore.datasets.sequences.sequences_from_file`).  Reads and checks a file
    (:class:`DataError`); callers cache the result (:attr:`explore.space.Space.data`).

    >>> from types import SimpleNamespace as NS
    >>> resolve(NS(name="digits", valid=100, test=None, scale=None, seed=None)).features
    64
    """
    # sections of the sequence keys' time, and plain namespaces, may lack them
    def opt(key: str) -> Any:
        return getattr(section, key, None)

    if section.name is not None:
        ds = get(section.name)
        options = {"valid": section.valid if isinstance(section.valid, float) else None,
                   "test": section.test, "scale": section.scale, "seed": section.seed,
                   "window": opt("window"), "horizon": opt("horizon"),
                   "stride": opt("stride")}
        given = [k for k, v in options.items() if v is not None]
        refused = [k for k in given if k not in ds.options]
        if refused and not ds.options:
            raise DataError(f"dataset {section.name!r} has fixed splits and scaling; it "
                            f"takes no {refused[0]} (only row counts: train, valid)",
                            key=refused[0])
        if refused:
            raise DataError(f"dataset {section.name!r} takes no {refused[0]}; its options: "
                            f"{', '.join(sorted(ds.options))} (and row counts: train, "
                            "valid)", key=refused[0])
        return ds.configure(**{k: options[k] for k in given})
    # an integer valid is a head count of the split (explore.space.DatasetSection.heads)
    fraction = {"valid": section.valid if isinstance(section.valid, float) else None,
                "test": section.test if is_fraction(section.test) else None}
    fractions = {k: v for k, v in fraction.items() if v is not None}
    if opt("kind") == "series":
        assert section.path is not None and section.target is not None
        return series_from_file(
            section.path, section.target, columns=opt("columns"), time=opt("time"),
            window=opt("window"), horizon=opt("horizon") or 1, stride=opt("stride") or 1,
            task=section.task or "regression", scale=section.scale or "standard",
            **fractions)
    if opt("kind") == "sequences":
        return sequences_from_file(
            section.path, x=section.x, y=section.y, lengths=opt("lengths"),
            padding=opt("padding"), vocab=opt("vocab"), scale=section.scale,
            task=section.task, seed=section.seed or 0, **fractions)
    valid = section.valid if isinstance(section.valid, float | Path) else 0.2
    return from_file(
        section.path, section.target, x=section.x, y=section.y, features=section.features,
        categorical=section.categorical or (), valid=valid,
        test=0.0 if section.test is None else section.test,
        scale=section.scale or "standard", task=section.task, seed=section.seed or 0,
        missing=section.missing or "error", impute=section.impute or "median")
