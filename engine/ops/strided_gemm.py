"""Matrix products over strided views on a GPU, straight through cuBLAS.

CuPy's ``matmul(a, b, out=)`` copies an operand that is neither C- nor F-contiguous
(``a[:, k, :]``, one model's rows of a ``[b, K, n]`` stack) and computes into a
temporary when ``out`` is such a view: a stacked model's product took two allocations
from the memory pool per model at every step.  cuBLAS needs no copy: each of those
matrices has one unit stride, a leading dimension and, across the models, one batch
stride, which is what ``gemmStridedBatched`` reads.  :func:`strided_matmul` binds such
a product once; it returns None where a view has no unit stride (the caller keeps
``matmul``), and on the host, whose BLAS path is numpy's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops._base import Step, data_ptr, is_numpy

_N, _T = 0, 1  # cublasOperation_t


def _layout(m: Any) -> tuple[int, int] | None:
    """``(op, ld)`` of a 2-D view read as cuBLAS's column-major operand of the swapped
    product (``C^T = B^T A^T``): a row-major matrix is its own transpose there (op N,
    ld its row stride, at least its columns), a column-major one is transposed (op T,
    ld its column stride, at least its rows); a dimension of length 1 may have any
    stride.  None: no such layout (no unit stride, or rows that overlap)."""
    rows, cols = m.shape
    item = m.dtype.itemsize
    sr, sc = m.strides[0] // item, m.strides[1] // item
    if cols == 1 or sc == 1:
        ld = sr if rows > 1 else cols
        return (_N, ld) if ld >= max(cols, 1) else None
    if rows == 1 or sr == 1:
        ld = sc if cols > 1 else rows
        return (_T, ld) if ld >= max(rows, 1) else None
    return None


def _writes_each_element_once(x: Any) -> bool:
    """Whether no two elements of the view share memory (sufficient test: with the
    dimensions of more than one element ordered by stride, each stride passes the
    span of the smaller ones), so that a product written into it is well defined."""
    item = x.dtype.itemsize
    dims = sorted((abs(st) // item, n) for st, n in zip(x.strides, x.shape, strict=True)
                  if n > 1)
    span = 0
    for stride, n in dims:
        if stride <= span:
            return False
        span += stride * (n - 1)
    return True


def _batch_stride(x: Any) -> int:
    return 0 if x.shape[0] == 1 else x.strides[0] // x.dtype.itemsize


def strided_matmul(xp: Any, a: Any, b: Any, out: Any) -> Step | None:
    """A step computing ``out = a @ b`` for 2-D views, or batched 3-D views
    ``[K, m, k] @ [K, k, n] -> [K, m, n]`` (a batch of 1 broadcasts: stride 0), in one
    cuBLAS call that reads and writes the views where they are.  None where it cannot
    (the host, another dtype than float32/float64, a view without a unit stride, or an
    output that is not row-major)."""
    if is_numpy(xp) or a.dtype != b.dtype or a.dtype != out.dtype or \
            a.dtype not in (np.float32, np.float64):
        return None
    a3, b3, c3 = (x if x.ndim == 3 else x[None] for x in (a, b, out))
    if a3.ndim != 3 or b3.ndim != 3 or c3.ndim != 3:
        return None
    batch, m, n = c3.shape
    k = a3.shape[2]
    if a3.shape[1:] != (m, k) or b3.shape[1:] != (k, n) or \
            a3.shape[0] not in (1, batch) or b3.shape[0] not in (1, batch) or 0 in (m, n, k):
        return None
    la, lb, lc = _layout(a3[0]), _layout(b3[0]), _layout(c3[0])
    if la is None or lb is None or lc is None or lc[0] != _N:
        return None
    if not _writes_each_element_once(c3) or any(s < 0 for x in (a3, b3, c3)
                                                 for s in x.strides):
        return None
    cublas = xp.cuda.cublas
    double = a.dtype == np.float64
    gemm = cublas.dgemmStridedBatched if double else cublas.sgemmStridedBatched
    one, zero = np.ones(1, a.dtype), np.zeros(1, a.dtype)  # host scalars cuBLAS reads
    # C^T [n, m] = B^T [n, k] @ A^T [k, m], all column-major over the same memory
    args = (lb[0], la[0], n, m, k, one.ctypes.data, data_ptr(b3), lb[1], _batch_stride(b3),
            data_ptr(a3), la[1], _batch_stride(a3), zero.ctypes.data, data_ptr(c3), lc[1],
            _batch_stride(c3), batch)
    return _Gemm(xp, gemm, args, (one, zero))


def matmul_step(xp: Any, a: Any, b: Any, out: Any) -> Step:
    """``out = a @ b``: :func:`strided_matmul` where it binds, else ``matmul``."""
    return strided_matmul(xp, a, b, out) or (lambda: xp.matmul(a, b, out=out))


class _Gemm:
    """One bound cuBLAS call (the host scalars it points to kept alive with it).  The
    handle is CuPy's for the thread and device that run the step, asked at each call
    (a cached lookup)."""

    def __init__(self, xp: Any, gemm: Any, args: tuple[Any, ...], keep: Any) -> None:
        self.xp, self.gemm, self.args, self.keep = xp, gemm, args, keep
        self.set_stream = xp.cuda.cublas.setStream

    def __call__(self) -> None:
        handle = self.xp.cuda.device.get_cublas_handle()
        self.set_stream(handle, self.xp.cuda.get_current_stream().ptr)
        self.gemm(handle, *self.args)
