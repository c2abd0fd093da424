"""The built-in time series ``sunspots``: the yearly mean sunspot numbers of 1700-2008,
read from the CSV file inside the installed statsmodels package without importing it
(see :func:`statsmodels_file`), as windows (:class:`~explore.datasets.series.SeriesDataset`).

>>> from explore.datasets import get
>>> get("sunspots").configure(window=11, test=0.0).rows
(236, 51, 0)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from explore.datasets._base import BaseDataset, LoadedData, register
from explore.datasets.errors import DataError
from explore.datasets.sequence_shape import SequenceShape
from explore.datasets.series import SeriesDataset


def statsmodels_file(*parts: str) -> Path:
    """A data file of statsmodels' (``statsmodels/datasets/...``), found without
    importing statsmodels (which pulls in scipy and pandas)."""
    spec = importlib.util.find_spec("statsmodels")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("this dataset is read from the statsmodels package: "
                        "pip install statsmodels")
    path = Path(next(iter(spec.submodule_search_locations)), "datasets", *parts)
    if not path.is_file():
        raise DataError(f"{path} is missing: reinstall statsmodels")
    return path


SUNSPOTS_DEFAULTS: dict[str, Any] = {"window": 22, "horizon": 1, "stride": 1,
                                     "valid": 0.2, "test": 0.2, "scale": "standard"}


@register("sunspots")
class Sunspots(BaseDataset):
    """The yearly mean sunspot numbers of 1700-2008 (309 years; statsmodels'
    ``sunspots``), a regression of the next year's number from the last ``window``
    years.  The solar cycle is about 11 years; the default window, 22, holds two.
    Defaults: window 22, horizon 1, stride 1, valid 0.2, test 0.2 (the last 62 years
    each), scale standard; the search space may change them
    (``dataset: {name: sunspots, window: 33, horizon: 3}``).  The class attributes
    describe the defaults; :meth:`configure` gives the :class:`SeriesDataset`."""

    name = "sunspots"
    years = (1700, 2008)
    options = frozenset(SUNSPOTS_DEFAULTS)
    task = "regression"
    features, classes, valid = 22, 0, 40
    sequence = SequenceShape(22, 1)

    def __init__(self) -> None:
        self._default: SeriesDataset | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns ``YEAR`` and ``SUNACTIVITY``, as the file has them."""
        path = statsmodels_file("sunspots", "sunspots.csv")
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        first, last = self.years
        if table.shape != (last - first + 1, 2) or table[0, 0] != first or \
                table[-1, 0] != last:
            raise DataError(f"{path}: expected the years {first}-{last} and their sunspot "
                            f"numbers, got a table of {table.shape}")
        return {"YEAR": table[:, 0].astype(np.int64), "SUNACTIVITY": table[:, 1]}

    def configure(self, **options: Any) -> SeriesDataset:
        given = {k: v for k, v in options.items() if v is not None}
        unknown = sorted(set(given) - self.options)
        if unknown:
            raise DataError(f"sunspots: no option {unknown[0]}; it takes "
                            f"{', '.join(sorted(self.options))}", key=unknown[0])
        if not given and self._default is not None:
            return self._default
        ds = SeriesDataset(self.arrays(), "SUNACTIVITY", time="YEAR", name=self.name,
                           where="sunspots", **{**SUNSPOTS_DEFAULTS, **given})
        if not given:
            self._default = ds
        return ds

    def load(self) -> LoadedData:
        return self.configure().load()
