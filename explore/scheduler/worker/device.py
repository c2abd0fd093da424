"""What a worker process costs on its device before any trial: a warm-up that runs once
what every trial will run, then the bytes the process holds, measured; and the C heap's
freed memory handed back, so that what a trial's set-up freed is not counted."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from typing import Any

import numpy as np

from engine import Adam, compile_graph
from engine.models import paper_mlp
from engine.ops import jit
from engine.runtime.train import evaluate_metrics, train_epoch
from engine.runtime.vm import VM
from explore.procmem import gpu_bytes, pss_and_shmem


def cupy_module() -> Any:
    """The ``cupy`` module, which only a GPU worker uses."""
    import cupy  # noqa: PLC0415 (optional dependency: the gpu extra)

    return cupy


def release_heap_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``): what
    a trial's set-up allocated and freed would otherwise stay counted in the worker."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


NUMBA_BLAS = "scipy.linalg.cython_blas"
"""What numba imports when it is imported, to see whether ``np.dot`` can be compiled."""


def numba_without_blas() -> None:
    """Import numba (where the fused kernels are on) without its BLAS check.  On import
    numba loads scipy's BLAS bindings (``scipy.linalg`` and what that imports, time and
    memory every worker would be charged: ``docs/measurements.md``) in case compiled
    code calls ``np.dot``; the engine's kernels call no BLAS from compiled code, and a
    worker runs nothing else compiled.  The bindings' import is made to fail while numba checks
    (``sys.modules[name] = None``, Python's way to refuse a module), then allowed again.
    Numba then compiles no ``np.dot`` in this process, so this is for workers only."""
    if not jit.enabled() or "numba" in sys.modules or NUMBA_BLAS in sys.modules:
        return
    sys.modules[NUMBA_BLAS] = None  # type: ignore[assignment]
    try:
        import numba.np.arraymath  # noqa: F401, PLC0415 (the module that checks)
    except Exception:  # no numba, or a broken one: the numpy kernels do the work
        pass
    finally:
        del sys.modules[NUMBA_BLAS]


def warm_up(device: str = "cpu") -> None:
    """Run once, on a throwaway model, what every trial will run (a VM's set-up, training
    and validation steps, BLAS's first products, which allocate its buffers), so that
    the overhead measured next is what the worker costs with a model, not before one.
    On a GPU the model runs there: cuBLAS's handle and workspace and the compiled
    kernels exist from then on, and are in the device memory measured next."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    vm = VM(compile_graph(paper_mlp((64, 256, 10)), batch_size=32, optimizer=Adam(),
                          device=device))
    train_epoch(vm, x, y, rng, batch=32)
    evaluate_metrics(vm, x, y, ("accuracy",), path="eval")
    a = rng.random((512, 512), dtype=np.float32)
    a @ a  # a product big enough for BLAS to use all of its packing buffers
    del vm, a
    gc.collect()
    release_heap_memory()
    if device == "gpu":  # the throwaway heap's blocks, which CuPy's pool would keep
        cupy_module().get_default_memory_pool().free_all_blocks()


def device_overhead(device: str) -> int:
    """Fixed bytes this worker occupies on its device before any arena.  On the CPU its
    proportional set size: the interpreter, numpy and the engine, with the shared
    libraries the scheduler maps too counted at their share (a worker's resident size
    counts them whole, about 12 MB more, though starting it does not load them
    again), less any shared memory it maps (the data set's pages, counted as the
    data).  On the GPU the device memory this process holds once its CUDA context and
    cuBLAS handle exist (:func:`explore.procmem.gpu_bytes`), or, where the driver does
    not list it, the device's memory in use (conservative: it includes what other
    processes hold, the workers started beside it among them)."""
    if device == "gpu":
        own = gpu_bytes()
        if own is not None:
            return own
        free, total = cupy_module().cuda.runtime.memGetInfo()
        return int(total - free)
    total, shmem = pss_and_shmem()  # the data set's pages it has read are the data's
    return total - shmem
