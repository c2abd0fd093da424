"""The data set the workers train on, prepared once and put in shared memory."""

from __future__ import annotations

import numpy as np

from explore import datasets
from explore.datasets import Dataset, quantize
from explore.shared import SharedArrays
from explore.space import Space


def share_dataset(space: Space, data: Dataset) -> SharedArrays:
    """The space's share of ``data`` (its ``dataset.train``/``valid`` heads) in one
    shared-memory block, as ``x_train``, ``y_train``, ``x_valid``, ``y_valid``.
    Images of a known pixel scale are kept as uint8 (``explore.datasets.quantize``): a
    quarter of the float32 bytes, the same values once the model dequantizes them.
    The caller closes the block."""
    train = data.train
    if space.dataset.train:
        train = train.head(space.dataset.train)
    valid = data.valid.head(space.dataset.valid) if space.dataset.valid else data.valid
    scale = datasets.get(space.dataset.name).pixel_scale
    xt, xv = (_compact(train.x, scale), _compact(valid.x, scale)) if scale else \
        (train.x, valid.x)
    return SharedArrays({"x_train": xt, "y_train": train.y, "x_valid": xv, "y_valid": valid.y})


def _compact(x: np.ndarray, scale: float) -> np.ndarray:
    """Pixels as uint8: already so when loaded with ``load_compact``."""
    return x if x.dtype == np.uint8 else quantize(x, scale)
