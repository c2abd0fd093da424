"""One table as read, before it is checked (:class:`Source`): a DataFrame, or a
features array and its target.  Data a caller holds becomes one through
:func:`as_source`, a file through :mod:`explore.datasets.data_files`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from explore.datasets.errors import DataError, listing
from explore.datasets.preprocess import _is_frame

if TYPE_CHECKING:
    import pandas as pd

Table = Any  # a DataFrame, or a pair (features, target) of arrays or lists


@dataclass
class Source:
    """One table as read: a DataFrame, or a features array ``x`` and its target ``y``."""

    where: str  # for messages: the file, or "the DataFrame"
    frame: pd.DataFrame | None = None
    x: np.ndarray | None = None  # [n, ...] numeric (possibly memory-mapped)
    y: np.ndarray | None = None
    names: list[str] | None = None  # of x's columns (default x0, x1, ...)
    csv: Path | None = None  # the CSV file the frame was read from (rows' lines in messages)

    @property
    def n(self) -> int:
        if self.frame is not None:
            return len(self.frame)
        assert self.x is not None
        return len(self.x)


def as_source(data: Table, where: str) -> Source:
    """``data`` (a DataFrame, a pair ``(X, y)`` or a :class:`Source`) as a source;
    ``where`` names it in messages."""
    if isinstance(data, Source):
        return data
    if _is_frame(data):
        return Source(where, frame=data)
    if isinstance(data, tuple | list) and len(data) == 2:
        x = data[0] if isinstance(data[0], np.ndarray) else np.asarray(data[0])
        y = np.asarray(data[1])
        return Source(where, x=x, y=y)
    raise DataError(f"{where}: expected a pandas DataFrame or a pair (X, y) of arrays, "
                    f"got {type(data).__name__}")


def require_rows(s: Source, key: str | None) -> None:
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
            f" (columns: {listing([str(c) for c in s.frame.columns])})"
        raise DataError(f"{s.where}: no rows{cols}: nothing to learn from", key=key)
