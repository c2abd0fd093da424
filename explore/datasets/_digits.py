"""scikit-learn's bundled 8x8 digits: a small stand-in for MNIST."""

from __future__ import annotations

import numpy as np

from explore.datasets._base import BaseDataset, Dataset, Split, register
from explore.datasets.errors import DataError


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


@register("digits")
class Digits(BaseDataset):
    features, classes, image, valid = 64, 10, (1, 8, 8), 359
    pixel_scale = 1 / 16  # the pixels are k/16

    def load(self) -> Dataset:
        return load_digits()
