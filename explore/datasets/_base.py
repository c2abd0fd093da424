"""What a dataset is, and the registry of datasets by name.

A dataset plugin subclasses :class:`BaseDataset`, states what is known without
loading it (features, classes, image shape, validation size, pixel scale) and loads
the arrays as a :class:`LoadedData`.  Loaded data cross process boundaries only as the
scheduler's shared arrays (:mod:`explore.scheduler.shared_arrays`), never pickled whole;
``load`` is called once per run, in the scheduler's process, and may cache per process.
(The search space's ``dataset:`` section, which names one, is
:class:`explore.space.DatasetSection`.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from explore.datasets.errors import DataError
from explore.datasets.quantize import quantize
from explore.datasets.sequence_shape import SequenceShape
from explore.registry import Registry

if TYPE_CHECKING:
    from explore.datasets.preprocess import Preprocess

TASKS = ("classification", "regression")


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # float32 [n, features], or uint8 pixels (load_compact)
    # int64 [n] class indices 0..C-1 (classification), or float32 [n] targets
    # standardized with the dataset's target_scale (regression)
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def head(self, n: int) -> Split:
        return Split(self.x[:n], self.y[:n])


@dataclass(frozen=True)
class LoadedData:
    """A data set's arrays once loaded (:meth:`BaseDataset.load`, ``load_compact``): its
    train, valid and test :class:`Split`, and what the model needs to know of them."""

    name: str
    train: Split
    valid: Split
    test: Split
    classes: int  # 0 for regression
    task: str = "classification"  # or "regression"
    target_scale: tuple[float, float] | None = None  # regression: the y's (mean, std)

    @property
    def features(self) -> int:
        return int(self.train.x.shape[1])


# Makes a named array of a shape and dtype (the run's shared file, or plain memory).
Empty = Callable[[str, tuple[int, ...], Any], np.ndarray]


def plain_empty(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype)


class BaseDataset(ABC):
    """A data set, which :meth:`load` loads as a :class:`LoadedData`.  The attributes are
    known without loading its arrays: the scheduler and ``explore size`` compile
    candidates from them alone (a CNN reshapes a row to ``image``, a sequence family
    to ``sequence``).  A built-in one states them as class attributes; a file's
    (:class:`~explore.datasets.table.TableDataset`) knows them once it has read the
    file, as instance attributes."""

    features: int  # input values per sample (after one-hot encoding, for tables)
    classes: int  # classes of a classification; 0 for a regression
    # (channels, height, width) of the features; None for tables, which are no images
    image: tuple[int, int, int] | None = None
    # How a row reads as a sequence (steps of channels, a presence flag per step, token
    # ids; explore.datasets.sequence_shape); None for tables and images.  A sequence
    # data set has features == sequence.features and image None.
    sequence: SequenceShape | None = None
    valid: int  # samples in the validation split
    # samples in a built-in set's training split, where known without loading it (a
    # table's are in its ``rows``): a ``train:`` head beyond it is refused
    train_rows: int | None = None
    # Images of k * pixel_scale (k in 0..255) are kept as uint8 and dequantized exactly
    # by the model's first op; None keeps float32 features.
    pixel_scale: float | None = None
    task: str = "classification"  # or "regression"
    # The fitted preprocessing of a table (explore.datasets.table.Preprocess); None
    # for built-ins with fixed scaling.
    preprocess: Preprocess | None = None
    # Regression: the training target's (mean, std).  The splits' y are standardized
    # with it, (y - mean) / std; predictions are multiplied back (Preprocess.unscale).
    target_scale: tuple[float, float] | None = None
    # The table options (valid/test fractions, scale, seed) that configure() takes.
    options: ClassVar[frozenset[str]] = frozenset()

    @property
    def outputs(self) -> int:
        """Values the model predicts per sample: the classes, or 1 for a regression."""
        return 1 if self.task == "regression" else self.classes

    @property
    def known_train_rows(self) -> int | None:
        """The training split's rows where known without loading it (a table's
        ``rows``, a built-in's :attr:`train_rows`); None where not."""
        rows = getattr(self, "rows", None)
        return int(rows[0]) if rows is not None else self.train_rows

    @abstractmethod
    def load(self) -> LoadedData:
        """The arrays (raises :class:`DataError` when they cannot be had)."""

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty) -> LoadedData:
        """What a run trains on: the first ``train`` and ``valid`` rows (None: all), no
        test rows, images as exact uint8 pixels when ``pixel_scale`` is set, each array
        made by ``empty(name, shape, dtype)`` (names ``x_train``, ``y_train``,
        ``x_valid``, ``y_valid``) and filled in place.  The scheduler passes the
        allocator of its shared file, so the run's data set exists once, compact, even
        while it loads.  The default loads everything and converts; a dataset whose
        files are large overrides it to read only those rows (MNIST streams its
        pickle) and so never holds the float32 set."""
        return compact(self.load(), train, valid, self.pixel_scale, empty)

    def configure(self, **options: Any) -> BaseDataset:
        """This data set with the table ``options`` (those in :attr:`options`:
        ``valid``/``test`` fractions, ``scale``, ``seed``); without any, itself.  A
        built-in with fixed splits and scaling accepts none (:class:`DataError`)."""
        given = {k: v for k, v in options.items() if v is not None}
        if not given:
            return self
        raise DataError(f"this dataset has fixed splits and scaling; it takes no "
                        f"{', '.join(given)} (only row counts: train, valid)",
                        key=next(iter(given)))


def compact(data: LoadedData, train: int | None, valid: int | None, scale: float | None,
            empty: Empty = plain_empty) -> LoadedData:
    """The first ``train`` and ``valid`` rows of ``data`` (None: all) copied into arrays
    made by ``empty`` (see :meth:`BaseDataset.load_compact`), images as exact uint8
    pixels of ``scale`` when one is given (and they are not uint8 already)."""
    out = []
    for name, split, n in (("train", data.train, train), ("valid", data.valid, valid)):
        s = split.head(n) if n is not None else split
        packed = scale is not None and s.x.dtype != np.uint8
        x = empty(f"x_{name}", s.x.shape, np.uint8 if scale is not None else s.x.dtype)
        x[...] = quantize(s.x, scale) if packed and scale is not None else s.x
        y = empty(f"y_{name}", s.y.shape, np.float32 if data.task == "regression" else np.int64)
        y[...] = s.y
        out.append(Split(x, y))
    none = Split(out[0].x[:0], out[0].y[:0])
    return LoadedData(data.name, out[0], out[1], none, data.classes, data.task, data.target_scale)


DATASETS: Registry[BaseDataset] = Registry("dataset", error=DataError)
register = DATASETS.register


def get(name: str) -> BaseDataset:
    """The dataset ``name`` (:class:`DataError` listing the available ones if none)."""
    return DATASETS.get(name)
