"""The machine's GEMM peak: the FLOP rate of float32 square matrix products large enough
for the BLAS (or cuBLAS) to reach its best, the yardstick of model-FLOPs utilisation.

:func:`measure_gemm_peak` times products of 512, 1024 and 2048 (on a GPU 1024 to 8192)
rows within a time budget and keeps the best rate: a measurement can only be slowed by
what else runs, never sped up.  On the CPU ``threads`` limits the BLAS's threads for the
measurement (explore's workers run one each); on a GPU each product is synchronised.
Explore caches the figure per machine (:mod:`explore.scheduler.peak`).

>>> rate = measure_gemm_peak("cpu", threads=1, seconds=0.05)
>>> rate > 1e8
True
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

CPU_SIZES = (512, 1024, 2048)
"""Square sizes timed on the CPU: from 512 a BLAS runs near its peak on one core; 2048
gives several cores enough work."""
GPU_SIZES = (1024, 2048, 4096, 8192)
"""Square sizes timed on a GPU, which needs far larger products to fill."""


def measure_gemm_peak(device: str = "cpu", threads: int | None = None,
                      seconds: float = 0.5, max_bytes: int | None = None) -> float:
    """The best float32 GEMM rate of ``device`` ("cpu" or "gpu"), in FLOP/s, within about
    ``seconds`` (the smallest size is timed whatever the budget; a larger one only where
    a warm-up and one timed product fit the time left).  ``threads``: BLAS threads on
    the CPU (None: the library's own setting); ignored on a GPU.  ``max_bytes``: the most
    the three operands of a product may take (a caller whose memory is budgeted); a
    ValueError where not even the smallest size fits.

    >>> measure_gemm_peak("cpu", max_bytes=1_000_000)
    Traceback (most recent call last):
    ValueError: no GEMM size fits 1,000,000 bytes: the smallest, 512, takes 3,145,728
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"unknown device {device!r}; available: cpu, gpu")
    if threads is not None and (isinstance(threads, bool) or int(threads) < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    sizes = CPU_SIZES if device == "cpu" else GPU_SIZES
    fitting = tuple(n for n in sizes if max_bytes is None or operand_bytes(n) <= max_bytes)
    if not fitting:
        raise ValueError(f"no GEMM size fits {max_bytes:,} bytes: the smallest, {sizes[0]}, "
                         f"takes {operand_bytes(sizes[0]):,}")
    if device == "gpu":
        return _gpu_rate(seconds, fitting)
    with _blas_threads(threads):
        return _best_rate(_cpu_product, fitting, seconds)


def operand_bytes(n: int) -> int:
    """The bytes of a float32 product's three ``n x n`` operands."""
    return 3 * n * n * 4


@contextlib.contextmanager
def _blas_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(threads), user_api="blas"):
        yield


def _cpu_product(n: int) -> Callable[[], None]:
    # 0.5 everywhere: sums stay normal floats (denormals would slow some BLAS kernels)
    a = np.full((n, n), 0.5, dtype=np.float32)
    b = np.full((n, n), 0.5, dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)

    def run() -> None:
        np.matmul(a, b, out=c)

    return run


def _gpu_rate(seconds: float, sizes: tuple[int, ...] = GPU_SIZES) -> float:
    """The device's rate, its memory pool emptied afterwards: the operands (768 MB at
    8192) must not stay cached in a process whose device memory is budgeted."""
    from engine.runtime.backends.cupy_backend import import_cupy

    cp: Any = import_cupy()
    try:
        return _best_rate(lambda n: _gpu_product(cp, n), sizes, seconds)
    finally:
        cp.get_default_memory_pool().free_all_blocks()


def _gpu_product(cp: Any, n: int) -> Callable[[], None]:
    # CuPy's float32 product, as the engine's GPU kernels run it (TF32 only where the
    # user turned it on for both, CUPY_TF32=1)
    a = cp.full((n, n), 0.5, dtype=cp.float32)
    b = cp.full((n, n), 0.5, dtype=cp.float32)
    c = cp.empty((n, n), dtype=cp.float32)
    sync = cp.cuda.get_current_stream().synchronize

    def run() -> None:
        cp.matmul(a, b, out=c)
        sync()  # the host's clock sees the product only once the device finished it

    return run


def _best_rate(make: Callable[[int], Callable[[], None]], sizes: tuple[int, ...],
               seconds: float) -> float:
    """The best ``2n³ / time`` over the sizes: each size is warmed up once (the BLAS
    packs, threads wake, cuBLAS picks its kernel), then timed until its share of the
    budget is spent, at least once."""
    deadline = time.perf_counter() + seconds
    best = 0.0
    for i, n in enumerate(sizes):
        work = 2.0 * n**3
        left = deadline - time.perf_counter()
        if best and 2 * work / best > left:  # a warm-up and one timed product must fit
            break
        try:
            run = make(n)
        except MemoryError:  # a device too small for this size (CuPy's error is one)
            if best:
                break
            raise
        run()
        share = time.perf_counter() + max(left / (len(sizes) - i), 0.0)
        while True:
            t0 = time.perf_counter()
            run()
            dt = time.perf_counter() - t0
            best = max(best, work / max(dt, 1e-9))
            now = time.perf_counter()
            if now + dt > min(share, deadline):
                break
    return best
