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

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()
