"""What a dataset is, and the registry of datasets by name.

A dataset plugin subclasses :class:`BaseDataset`, states what is known without
loading it (features, classes, image shape, validation size, pixel scale) and loads
the arrays.  Loaded data sets cross process boundaries only as the scheduler's shared
arrays (:mod:`explore.shared`), never pickled whole; ``load`` is called once per run,
in the scheduler's process, and may cache per process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from explore.datasets.errors import DataError
from explore.datasets.quantize import quantize
from explore.registry import Registry


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # float32 [n, features] in [0, 1], or uint8 pixels (load_compact)
    y: np.ndarray  # int64 [n]

    def __len__(self) -> int:
        return len(self.y)

    def head(self, n: int) -> Split:
        return Split(self.x[:n], self.y[:n])


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    valid: Split
    test: Split
    classes: int

    @property
    def features(self) -> int:
        return int(self.train.x.shape[1])


# Makes a named array of a shape and dtype (the run's shared file, or plain memory).
Empty = Callable[[str, tuple[int, ...], Any], np.ndarray]


def plain_empty(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype)


class BaseDataset(ABC):
    """A data set by name.  The class attributes are known without loading it: the
    scheduler and ``explore size`` compile candidates from them alone."""

    features: ClassVar[int]  # input values per sample
    classes: ClassVar[int]
    image: ClassVar[tuple[int, int, int]]  # (channels, height, width) of the features
    valid: ClassVar[int]  # samples in the validation split
    # Images of k * pixel_scale (k in 0..255) are kept as uint8 and dequantized exactly
    # by the model's first op; None keeps float32 features.
    pixel_scale: ClassVar[float | None] = None

    @abstractmethod
    def load(self) -> Dataset:
        """The arrays (raises :class:`DataError` when they cannot be had)."""

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty) -> Dataset:
        """What a run trains on: the first ``train`` and ``valid`` rows (None: all), no
        test rows, images as exact uint8 pixels when ``pixel_scale`` is set, each array
        made by ``empty(name, shape, dtype)`` (names ``x_train``, ``y_train``,
        ``x_valid``, ``y_valid``) and filled in place.  The scheduler passes the
        allocator of its shared file, so the run's data set exists once, compact, even
        while it loads.  The default loads everything and converts; a dataset whose
        files are large overrides it to read only those rows (MNIST streams its
        pickle) and so never holds the float32 set."""
        return compact(self.load(), train, valid, self.pixel_scale, empty)


def compact(data: Dataset, train: int | None, valid: int | None, scale: float | None,
            empty: Empty = plain_empty) -> Dataset:
    """The first ``train`` and ``valid`` rows of ``data`` (None: all) copied into arrays
    made by ``empty`` (see :meth:`BaseDataset.load_compact`), images as exact uint8
    pixels of ``scale`` when one is given (and they are not uint8 already)."""
    out = []
    for name, split, n in (("train", data.train, train), ("valid", data.valid, valid)):
        s = split.head(n) if n is not None else split
        packed = scale is not None and s.x.dtype != np.uint8
        x = empty(f"x_{name}", s.x.shape, np.uint8 if scale is not None else s.x.dtype)
        x[...] = quantize(s.x, scale) if packed and scale is not None else s.x
        y = empty(f"y_{name}", s.y.shape, np.int64)
        y[...] = s.y
        out.append(Split(x, y))
    none = Split(out[0].x[:0], out[0].y[:0])
    return Dataset(data.name, out[0], out[1], none, data.classes)


DATASETS: Registry[BaseDataset] = Registry("dataset", error=DataError)
register = DATASETS.register


def get(name: str) -> BaseDataset:
    """The dataset ``name`` (:class:`DataError` listing the available ones if none)."""
    return DATASETS.get(name)
