"""The strided cuBLAS products, checked on the CPU: a stand-in for CuPy whose
``sgemmStridedBatched`` follows cuBLAS's contract (column-major operands at device
addresses, leading dimensions, batch strides) over host memory, so that the layouts
:func:`engine.ops.strided_gemm.strided_matmul` derives from numpy views are checked
against ``a @ b`` for every view the stacked kernels bind (tests/engine/runtime/
test_gpu.py runs the real cuBLAS where a GPU is lent)."""

from __future__ import annotations

import ctypes
import types
from typing import Any

import numpy as np
import pytest

from engine.ops.strided_gemm import strided_matmul


def _at(ptr: int, count: int, dtype: Any) -> np.ndarray:
    """``count`` elements of host memory at address ``ptr``, as an array (no copy)."""
    ctype = ctypes.c_double if np.dtype(dtype) == np.float64 else ctypes.c_float
    return np.ctypeslib.as_array((ctype * count).from_address(ptr))


def fake_cupy(dtype: Any) -> tuple[types.ModuleType, list[tuple]]:
    calls: list[tuple] = []

    def gemm(handle: int, ta: int, tb: int, m: int, n: int, k: int, alpha: int,
             a: int, lda: int, sa: int, b: int, ldb: int, sb: int, beta: int,
             c: int, ldc: int, sc: int, batch: int) -> None:
        calls.append((ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch))
        al, be = _at(alpha, 1, dtype)[0], _at(beta, 1, dtype)[0]

        def col_major(ptr: int, rows: int, cols: int, ld: int) -> np.ndarray:
            assert ld >= max(1, rows), "cuBLAS refuses a leading dimension this small"
            flat = _at(ptr, ld * (cols - 1) + rows, dtype)
            return np.lib.stride_tricks.as_strided(
                flat, (rows, cols), (flat.itemsize, ld * flat.itemsize))

        item = np.dtype(dtype).itemsize
        for i in range(batch):
            ar, ac = (m, k) if ta == 0 else (k, m)
            br, bc = (k, n) if tb == 0 else (n, k)
            am = col_major(a + i * sa * item, ar, ac, lda)
            bm = col_major(b + i * sb * item, br, bc, ldb)
            cm = col_major(c + i * sc * item, m, n, ldc)
            opa, opb = (am if ta == 0 else am.T), (bm if tb == 0 else bm.T)
            cm[...] = al * (opa.astype(np.float64) @ opb) + be * cm

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        cublas=types.SimpleNamespace(sgemmStridedBatched=gemm, dgemmStridedBatched=gemm,
                                     setStream=lambda h, s: None),
        device=types.SimpleNamespace(get_cublas_handle=lambda: 7),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    return cupy, calls


RNG = np.random.default_rng(0)
B, K, N_IN, N_OUT = 5, 3, 4, 6


def stack(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def members(x: np.ndarray) -> np.ndarray:
    """[b, K, n] as [K, b, n] (a view: rows K*n apart, models n apart)."""
    return x.transpose(1, 0, 2)


CASES = {
    "2-D contiguous": lambda: (stack(B, N_IN), stack(N_IN, N_OUT), np.zeros((B, N_OUT),
                                                                            np.float32)),
    "2-D transposed weight": lambda: (stack(B, N_IN), stack(N_OUT, N_IN).T,
                                      np.zeros((B, N_OUT), np.float32)),
    "2-D transposed input": lambda: (stack(N_IN, B).T, stack(N_IN, N_OUT),
                                     np.zeros((B, N_OUT), np.float32)),
    "one model's rows of a stack": lambda: (stack(B, K, N_IN)[:, 1, :], stack(N_IN, N_OUT),
                                            np.zeros((B, K, N_OUT), np.float32)[:, 2, :]),
    "stacked forward": lambda: (members(stack(B, K, N_IN)), stack(K, N_IN, N_OUT),
                                members(np.zeros((B, K, N_OUT), np.float32))),
    "stacked forward, weights [K, out, in]": lambda: (
        members(stack(B, K, N_IN)), stack(K, N_OUT, N_IN).transpose(0, 2, 1),
        members(np.zeros((B, K, N_OUT), np.float32))),
    "shared input broadcast": lambda: (stack(B, N_IN)[None], stack(K, N_IN, N_OUT),
                                       members(np.zeros((B, K, N_OUT), np.float32))),
    "weight gradient A^T dY": lambda: (members(stack(B, K, N_IN)).transpose(0, 2, 1),
                                       members(stack(B, K, N_OUT)),
                                       np.zeros((K, N_IN, N_OUT), np.float32)),
    "input gradient dY W^T": lambda: (members(stack(B, K, N_OUT)),
                                      stack(K, N_IN, N_OUT).transpose(0, 2, 1),
                                      members(np.zeros((B, K, N_IN), np.float32))),
    "a single row": lambda: (stack(1, N_IN), stack(N_IN, N_OUT),
                             np.zeros((1, N_OUT), np.float32)),
    "float64": lambda: (stack(B, N_IN).astype(np.float64), stack(N_IN, N_OUT).astype(
        np.float64), np.zeros((B, N_OUT))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_strided_product_is_a_at_b_in_place(case: str) -> None:
    a, b, out = CASES[case]()
    cupy, calls = fake_cupy(a.dtype)
    before = out.base if out.base is not None else out
    snapshot = before.copy()
    step = strided_matmul(cupy, a, b, out)
    assert step is not None
    step()
    expected = np.matmul(a.astype(np.float64), b).astype(a.dtype)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1  # one cuBLAS call, however many models
    # nothing outside the output's view was written
    outside = np.ones(before.shape, bool)
    _mark(outside, before, out, False)
    np.testing.assert_array_equal(before[outside], snapshot[outside])


def _mark(marks: np.ndarray, base: np.ndarray, view: np.ndarray, value: bool) -> None:
    """Set ``marks`` (shaped like ``base``) to ``value`` where ``view`` (a view of
    ``base``) lies."""
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    item = base.itemsize
    for idx in np.ndindex(view.shape):
        offset = (start + sum(i * s for i, s in zip(idx, view.strides, strict=True))) // item
        marks.reshape(-1)[offset] = value


@pytest.mark.parametrize("case", ["no unit stride", "overlapping rows", "host",
                                  "mixed types", "integers", "output batches overlap"])
def test_what_it_cannot_bind_is_left_to_matmul(case: str) -> None:
    a, b, out = stack(B, N_IN), stack(N_IN, N_OUT), np.zeros((B, N_OUT), np.float32)
    cupy, _ = fake_cupy(np.float32)
    if case == "no unit stride":
        a = stack(B, 2 * N_IN)[:, ::2]
    elif case == "overlapping rows":
        a = np.lib.stride_tricks.as_strided(stack(B * N_IN), (B, N_IN), (4, 4))
    elif case == "host":
        cupy = np  # type: ignore[assignment]
    elif case == "mixed types":
        b = b.astype(np.float64)
    elif case == "output batches overlap":  # batch k's rows start one row after k-1's
        a, b = stack(K, B, N_IN), stack(K, N_IN, N_OUT)
        base = np.zeros((B + K) * N_OUT, np.float32)
        out = np.lib.stride_tricks.as_strided(base, (K, B, N_OUT), (4 * N_OUT, 4 * N_OUT, 4))
    else:
        a, b, out = (x.astype(np.int32) for x in (a, b, out))
    assert strided_matmul(cupy, a, b, out) is None
