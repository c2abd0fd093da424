"""scikit-learn's bundled 8x8 digits: a small stand-in for MNIST."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from explore.datasets._base import BaseDataset, LoadedData, Split, register
from explore.datasets.errors import DataError


def digits_file() -> Path:
    """scikit-learn's ``digits.csv.gz``, found without importing scikit-learn: the
    package pulls in scipy and takes about 70 MB of the run's memory for a 1,797-row
    table."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits dataset needs scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / \
        "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing: reinstall scikit-learn")
    return path


def load_digits(seed: int = 0) -> LoadedData:
    """scikit-learn's 8x8 digits (1,797 images), split 60/20/20, scaled to [0, 1]."""
    table = np.loadtxt(digits_file(), delimiter=",", ndmin=2)
    if table.shape != (1797, 65):
        raise DataError(f"{digits_file()}: expected 1797 rows of 64 pixels and a label, "
                        f"got {table.shape}")
    x = (table[:, :64] / 16.0).astype(np.float32)
    y = table[:, 64].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    a, b = int(0.6 * len(y)), int(0.8 * len(y))
    return LoadedData("digits", Split(x[:a], y[:a]), Split(x[a:b], y[a:b]), Split(x[b:], y[b:]), 10)


@register("digits")
class Digits(BaseDataset):
    features, classes, image, valid, train_rows = 64, 10, (1, 8, 8), 359, 1078
    pixel_scale = 1 / 16  # the pixels are k/16

    def load(self) -> LoadedData:
        return load_digits()
