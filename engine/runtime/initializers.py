"""Parameter initialisation: an :class:`~engine.graph.Init`'s values, written a bounded
chunk at a time.

numpy's Generator draws its doubles one after the other, so ``uniform(low, high, n)``
drawn in pieces of ``k`` gives the values (and leaves the generator where) one draw of
``n`` does; likewise ``normal``.  A parameter is therefore written straight into its
place, at most :data:`CHUNK` values at a time: the temporary is bounded by a constant,
not by the model.  Each chunk is drawn in float64 and rounded to the parameter's dtype
as one whole-array conversion would.

>>> import numpy as np
>>> from engine.graph import Init
>>> v = initial_values(Init.uniform(-1, 1), (6, 3), np.float32, np.random.default_rng(0))
>>> v.shape, bool((abs(v) <= 1).all())
((6, 3), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.graph import Init

CHUNK = 1 << 16  # values drawn (as float64: 512 KiB) at a time

Draw = Callable[[int], Any]  # the next n values of an init, in C order (array or scalar)
Put = Callable[[int, np.ndarray], None]  # (first element, values): copy them in, then return


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
    """A new array of ``init``'s values (what :func:`fill_initial` writes)."""
    out = np.empty(shape, dtype=dtype)
    fill_initial(init, out, rng)
    return out


def fill_initial(init: Init, out: np.ndarray, rng: np.random.Generator) -> None:
    """Write ``init``'s values into the host array ``out`` (the parameter's shape and
    dtype, any strides: a view of a heap zone or of a paused model's buffer), drawing
    at most :data:`CHUNK` values at a time."""
    if init.method == "stacked":
        for k, member in enumerate(_members(init, out.shape)):
            fill_initial(member, init.member(out, k), rng)  # strided past the first axis
        return
    _write(_source(init, out.shape, rng), out, CHUNK)


def put_initial(init: Init, shape: tuple[int, ...], dtype: Any, rng: np.random.Generator,
                put: Put, start: int = 0) -> None:
    """``init``'s values for memory the host cannot write (a device's): ``put(first,
    values)`` receives contiguous runs of the parameter's elements in C order, as
    ``dtype``, at most :data:`CHUNK` at a time, through one reused host buffer (``put``
    must have read it when it returns).  A stacked parameter whose models are not its
    first axis interleaves them in memory: it is staged whole on the host (in
    ``dtype``) and then put in chunks."""
    dt = np.dtype(dtype)
    if init.method == "stacked":
        members = _members(init, shape)
        if init.model_axis:
            staged = np.empty(shape, dtype=dt)
            fill_initial(init, staged, rng)
            flat = staged.reshape(-1)
            for a in range(0, flat.size, CHUNK):
                put(start + a, flat[a : a + CHUNK])
            return
        size = math.prod(shape[1:])
        for k, member in enumerate(members):
            put_initial(member, shape[1:], dt, rng, put, start + k * size)
        return
    n = math.prod(shape)
    draw = _source(init, shape, rng)
    buf = np.empty(min(CHUNK, n), dtype=dt)
    for a in range(0, n, CHUNK):
        piece = buf[: min(CHUNK, n - a)]
        piece[...] = draw(len(piece))
        put(start + a, piece)


def _members(init: Init, shape: tuple[int, ...]) -> tuple[Init, ...]:
    assert init.members is not None
    if len(shape) <= init.model_axis or shape[init.model_axis] != len(init.members):
        raise GraphError(f"a stacked init of {len(init.members)} models cannot fill shape "
                         f"{shape}")
    return init.members


def _write(draw: Draw, out: np.ndarray, chunk: int) -> None:
    """Fill ``out`` in C order from ``draw``, at most ``chunk`` values a draw (whole
    trailing rows at a time when ``out`` is strided)."""
    if out.flags.c_contiguous:
        flat = out.reshape(-1)  # a view
        for a in range(0, flat.size, chunk):
            part = flat[a : a + chunk]
            part[...] = draw(len(part))
        return
    row = math.prod(out.shape[1:])
    if row > chunk:
        for i in range(out.shape[0]):
            _write(draw, out[i, ...], chunk)
        return
    if row == 0:
        return
    rows = max(1, chunk // row)
    for a in range(0, out.shape[0], rows):
        part = out[a : a + rows]
        values = draw(part.size)
        part[...] = values.reshape(part.shape) if np.ndim(values) else values


def _source(init: Init, shape: tuple[int, ...], rng: np.random.Generator) -> Draw:
    """The values of a non-stacked init of ``shape``, ``n`` at a time, as float64
    (what a whole-shape draw would give, in the same order)."""
    fan_in, fan_out = fans(shape)
    fan_in = init.fan_in or fan_in
    fan_out = init.fan_out or fan_out
    m = init.method
    if m == "zeros":
        return _constant(0.0)
    if m == "ones":
        return _constant(1.0)
    if m == "constant":
        return _constant(init.value)
    if m == "values":
        return _explicit(init, shape)
    if m == "uniform":
        return _uniform(rng, init.low, init.high)
    if m == "normal":
        return _normal(rng, init.mean, init.std)
    if m == "xavier_uniform":
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return _uniform(rng, -a, a)
    if m == "xavier_normal":
        return _normal(rng, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
    if m == "he_uniform":
        a = math.sqrt(6.0 / fan_in)
        return _uniform(rng, -a, a)
    if m == "he_normal":
        return _normal(rng, 0.0, math.sqrt(2.0 / fan_in))
    if m == "lecun_normal":
        return _normal(rng, 0.0, math.sqrt(1.0 / fan_in))
    raise GraphError(f"unknown init method {m!r}; known: {', '.join(Init.METHODS)}")


def _constant(value: float) -> Draw:
    v = np.float64(value)
    return lambda n: v


def _uniform(rng: np.random.Generator, low: float, high: float) -> Draw:
    return lambda n: rng.uniform(low, high, n)


def _normal(rng: np.random.Generator, mean: float, std: float) -> Draw:
    return lambda n: rng.normal(mean, std, n)


def _explicit(init: Init, shape: tuple[int, ...]) -> Draw:
    """Explicit contents: one value for the whole shape, or exactly one per element
    (read through, never copied whole)."""
    n = math.prod(shape)
    if init.array is not None:
        arr = init.array
        if arr.size == 1:
            return _constant(arr[0])
        if arr.size != n:
            raise ValueError(f"cannot reshape array of size {arr.size} into shape {shape}")
        flat, at = arr.reshape(-1), [0]

        def read(k: int) -> np.ndarray:
            at[0] += k
            return flat[at[0] - k : at[0]]  # a view

        return read
    assert init.values is not None
    if len(init.values) == 1:
        return _constant(init.values[0])
    if len(init.values) != n:
        raise ValueError(f"cannot reshape array of size {len(init.values)} into shape {shape}")
    it = iter(init.values)
    return lambda k: np.fromiter(it, np.float64, count=k)
