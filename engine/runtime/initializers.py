"""Parameter initialisation: host values for an :class:`~engine.graph.Init`.

>>> import numpy as np
>>> from engine.graph import Init
>>> v = initial_values(Init.uniform(-1, 1), (6, 3), np.float32, np.random.default_rng(0))
>>> v.shape, bool((abs(v) <= 1).all())
((6, 3), True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.graph import Init


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out): ``[in, out]`` matrices; ``[out, in, *k]`` convolution kernels."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def initial_values(init: Init, shape: tuple[int, ...], dtype: Any, rng: np.random.Generator
                   ) -> np.ndarray:
    if init.method == "stacked":
        assert init.members is not None
        if not shape or shape[0] != len(init.members):
            raise GraphError(f"a stacked init of {len(init.members)} models cannot fill shape "
                             f"{shape}")
        if init.transposed:
            return np.stack([initial_values(m, shape[:0:-1], dtype, rng).T
                             for m in init.members])
        return np.stack([initial_values(m, shape[1:], dtype, rng) for m in init.members])
    fan_in, fan_out = fans(shape)
    fan_in = init.fan_in or fan_in
    fan_out = init.fan_out or fan_out
    m = init.method
    if m == "zeros":
        out = np.zeros(shape)
    elif m == "ones":
        out = np.ones(shape)
    elif m == "constant":
        out = np.full(shape, init.value)
    elif m == "values":
        assert init.values is not None or init.array is not None
        vals = init.array if init.array is not None else np.asarray(init.values, np.float64)
        out = np.full(shape, vals[0]) if vals.size == 1 else vals.reshape(shape)
    elif m == "uniform":
        out = rng.uniform(init.low, init.high, shape)
    elif m == "normal":
        out = rng.normal(init.mean, init.std, shape)
    elif m == "xavier_uniform":
        a = math.sqrt(6.0 / (fan_in + fan_out))
        out = rng.uniform(-a, a, shape)
    elif m == "xavier_normal":
        out = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), shape)
    elif m == "he_uniform":
        a = math.sqrt(6.0 / fan_in)
        out = rng.uniform(-a, a, shape)
    elif m == "he_normal":
        out = rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)
    elif m == "lecun_normal":
        out = rng.normal(0.0, math.sqrt(1.0 / fan_in), shape)
    else:
        raise GraphError(f"unknown init method {m!r}; known: {', '.join(Init.METHODS)}")
    return np.asarray(out, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d 1-d)
