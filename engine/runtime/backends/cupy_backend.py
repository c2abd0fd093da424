"""The GPU backend: cupy, imported only when a GPU program is loaded."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.runtime.backends._base import Backend


def import_cupy() -> Any:
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise EngineError(
            "the GPU backend needs cupy: pip install 'calcgraph-explore[gpu]' "
            f"(cupy-cuda12x) or '[gpu13]' (cupy-cuda13x); import failed: {e}"
        ) from None
    if cupy.cuda.runtime.getDeviceCount() < 1:  # pragma: no cover
        raise EngineError("cupy is installed but no CUDA device is visible")
    no_accelerators(cupy)
    return cupy


def no_accelerators(cupy: Any) -> None:
    """Turn off CuPy's CUB and cuTENSOR routines for this process.

    Through them (CuPy's default since v11), every reduction (sum, max, min, mean: a
    loss, a bias gradient, a metric) takes temporary storage from the memory pool on
    each call: a step that allocates, a pool that grows in the first steps by what no
    plan counts (on the order of 100 MB, with the in-place copies, for an onnx VGG-19
    at batch 16: ``docs/measurements.md``), and a step no CUDA graph could hold.  CuPy's
    own reduction kernels write into ``out=`` and take nothing.  (CUB's path also fails
    outright on a min over two non-adjacent axes with ``out=``, in CuPy 14.2.)  The
    switch is CuPy's private API, process-wide (a user's own CuPy code in the same
    process runs without CUB too); ``CUPY_ACCELERATORS`` set in the environment is the
    public way, read at import."""
    core = getattr(cupy, "_core", None)
    for name in ("set_reduction_accelerators", "set_routine_accelerators",
                 "set_elementwise_accelerators"):
        setter = getattr(core, name, None)
        if setter is not None:
            setter([])


class CupyBackend(Backend):
    name = "gpu"

    def __init__(self) -> None:
        self.xp = import_cupy()

    def alloc(self, nbytes: int) -> Any:
        return self.xp.empty(int(nbytes), dtype=self.xp.uint8)

    def to_device(self, dst: Any, src: np.ndarray) -> None:
        dst.set(np.ascontiguousarray(src, dtype=dst.dtype))

    def to_host(self, src: Any) -> np.ndarray:
        return self.xp.asnumpy(src)

    def rng(self, seed: int) -> Any:
        return CounterRng(self.xp, seed)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(int(nbytes), dtype=np.uint8)  # async copies need pinning

    def copy_out(self, dst: np.ndarray, src: Any) -> None:
        src.get(stream=self.xp.cuda.get_current_stream(), out=dst, blocking=False)

    def copy_in(self, dst: Any, src: np.ndarray) -> None:
        dst.set(src, stream=self.xp.cuda.get_current_stream())

    def rng_state(self, rng: Any) -> Any:
        return rng.state

    def set_rng_state(self, rng: Any, state: Any) -> None:
        rng.state = state

    def memset(self, buf: Any, value: int = 0) -> None:
        if buf.nbytes:
            self.xp.cuda.runtime.memsetAsync(buf.data.ptr, value, buf.nbytes,
                                             self.xp.cuda.get_current_stream().ptr)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()


_HASH = r"""
unsigned long long z = seed + (offset + i) * 0x9E3779B97F4A7C15ULL;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
z ^= z >> 31;
out = (T)((z >> 40) * (1.0 / 16777216.0));
"""


class CounterRng:
    """A counter-based generator: element ``i`` of the ``n``-th draw is a hash
    (splitmix64) of the seed and ``n + i``.  Its state is two integers, so a paused
    model keeps it exactly (and on disk); it holds no device memory — cupy's own
    generators keep per-thread state of ~12 MB outside any planned zone.

    Draws are uniform in [0, 1) with 24 random bits (a float32's mantissa)."""

    def __init__(self, xp: Any, seed: int) -> None:
        self.seed = int(seed) & (2**64 - 1)
        self.counter = 0
        self._kernel = xp.ElementwiseKernel("uint64 seed, uint64 offset", "T out", _HASH,
                                            "calcgraph_counter_uniform")

    def random(self, out: Any, dtype: Any = None) -> Any:
        self._kernel(np.uint64(self.seed), np.uint64(self.counter & (2**64 - 1)), out)
        self.counter += int(out.size)
        return out

    @property
    def state(self) -> dict[str, int]:
        return {"seed": self.seed, "counter": self.counter}

    @state.setter
    def state(self, value: dict[str, int]) -> None:
        self.seed, self.counter = int(value["seed"]), int(value["counter"])
