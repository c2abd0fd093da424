"""scikit-learn's bundled tables: ``iris``, ``wine``, ``breast_cancer``
(classification) and ``diabetes`` (regression), read from the CSV files inside the
installed package without importing it (see :func:`sklearn_file`).

Each is a :class:`~explore.datasets.table.TableDataset` with the defaults valid 0.2,
test 0.2 (stratified for classification), scale standard, seed 0; the search space
may change those (``dataset: {name: iris, valid: 0.3, scale: minmax}``).  The class
labels are scikit-learn's target indices; diabetes's target is the raw disease
progression (standardized for training, ``target_scale`` says how), and its features
the raw ones, scaled here (what ``load_diabetes(scaled=False)`` reads).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from explore.datasets._base import BaseDataset, Empty, LoadedData, plain_empty, register
from explore.datasets.errors import DataError
from explore.datasets.source import Source
from explore.datasets.table import TableDataset

DEFAULTS: dict[str, Any] = {"valid": 0.2, "test": 0.2, "scale": "standard", "seed": 0}


def sklearn_file(name: str) -> Path:
    """A data file of scikit-learn's (``sklearn/datasets/data/<name>``), found without
    importing scikit-learn: the package pulls in scipy and takes about 70 MB of the
    run's memory for tables of a few hundred rows."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the dataset in {name} needs scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / name
    if not path.is_file():
        raise DataError(f"{path} is missing: reinstall scikit-learn")
    return path


class BundledTable(BaseDataset):
    """One of scikit-learn's tables.  The class attributes describe it with the default
    options; :meth:`configure` gives the :class:`TableDataset` (read and fitted) for
    those or other options."""

    name: ClassVar[str]  # as registered
    file: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]
    rows: ClassVar[int]
    options = frozenset(DEFAULTS)
    image = None

    def __init__(self) -> None:
        self._default: TableDataset | None = None

    def arrays(self) -> Source:
        """The features and the target (class indices, or the raw target values)."""
        path = sklearn_file(self.file)
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        if table.shape != (self.rows, len(self.columns) + 1):
            raise DataError(f"{path}: expected {self.rows} rows of {len(self.columns)} "
                            f"features and a target, got {table.shape}")
        return Source(self.file, x=table[:, :-1], y=table[:, -1].astype(np.int64),
                      names=list(self.columns))

    def configure(self, **options: Any) -> TableDataset:
        given = {k: v for k, v in options.items() if v is not None}
        unknown = sorted(set(given) - self.options)
        if unknown:
            raise DataError(f"{self.file}: no option {unknown[0]}", key=unknown[0])
        if not given and self._default is not None:
            return self._default
        opts = {**DEFAULTS, **given}

        def read() -> list[Source | None]:
            return [self.arrays(), None, None]

        ds = TableDataset._from_reader(read, None, None, (), opts["valid"], opts["test"],
                                       opts["scale"], self.task, opts["seed"],
                                       self.name)
        if not given:
            self._default = ds
        return ds

    def load(self) -> LoadedData:
        return self.configure().load()

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty) -> LoadedData:
        return self.configure().load_compact(train, valid, empty)


@register("iris")
class Iris(BundledTable):
    name = "iris"
    file, rows, features, classes, valid = "iris.csv", 150, 4, 3, 30
    columns = ("sepal length (cm)", "sepal width (cm)", "petal length (cm)",
               "petal width (cm)")


@register("wine")
class Wine(BundledTable):
    name = "wine"
    file, rows, features, classes, valid = "wine_data.csv", 178, 13, 3, 36
    columns = ("alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium",
               "total_phenols", "flavanoids", "nonflavanoid_phenols", "proanthocyanins",
               "color_intensity", "hue", "od280/od315_of_diluted_wines", "proline")


_CELL = ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity",
         "concave points", "symmetry", "fractal dimension")


@register("breast_cancer")
class BreastCancer(BundledTable):
    name = "breast_cancer"
    file, rows, features, classes, valid = "breast_cancer.csv", 569, 30, 2, 114
    columns = tuple(f"mean {w}" for w in _CELL) + tuple(f"{w} error" for w in _CELL) + \
        tuple(f"worst {w}" for w in _CELL)


@register("diabetes")
class Diabetes(BundledTable):
    name = "diabetes"
    file, rows, features, classes, valid = "diabetes_data_raw.csv.gz", 442, 10, 0, 88
    task = "regression"
    columns = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")

    def arrays(self) -> Source:
        x = np.loadtxt(sklearn_file(self.file), ndmin=2)
        y = np.loadtxt(sklearn_file("diabetes_target.csv.gz"))
        if x.shape != (self.rows, len(self.columns)) or y.shape != (self.rows,):
            raise DataError(f"{self.file}: expected {self.rows} rows of "
                            f"{len(self.columns)} features, got {x.shape} and {y.shape}")
        return Source(self.file, x=x, y=y, names=list(self.columns))
