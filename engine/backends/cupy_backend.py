"""The GPU backend: cupy, imported only when a GPU program is loaded."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends._base import Backend
from engine.errors import EngineError


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
    return cupy


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
        return self.xp.random.default_rng(seed)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(int(nbytes), dtype=np.uint8)  # async copies need pinning

    def copy_out(self, dst: np.ndarray, src: Any) -> None:
        src.get(stream=self.xp.cuda.get_current_stream(), out=dst, blocking=False)

    def copy_in(self, dst: Any, src: np.ndarray) -> None:
        dst.set(src, stream=self.xp.cuda.get_current_stream())

    def rng_state(self, rng: Any) -> Any:
        state = getattr(rng.bit_generator, "state", None)
        if state is None:
            raise EngineError("this cupy version cannot snapshot its random generator, so "
                              "a GPU model with random ops cannot be paused exactly")
        return state

    def memset(self, buf: Any, value: int = 0) -> None:
        if buf.nbytes:
            self.xp.cuda.runtime.memsetAsync(buf.data.ptr, value, buf.nbytes,
                                             self.xp.cuda.get_current_stream().ptr)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()
