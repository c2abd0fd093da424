"""Backends behind one small device interface; cupy is imported only on demand.

>>> get_backend("cpu").name
'cpu'
"""

from __future__ import annotations

from engine.runtime.backends._base import Backend
from engine.runtime.backends.numpy_backend import NumpyBackend


def get_backend(device: str) -> Backend:
    if device == "cpu":
        return NumpyBackend()
    if device == "gpu":
        from engine.runtime.backends.cupy_backend import CupyBackend

        return CupyBackend()
    raise ValueError(f"unknown device {device!r}; available: cpu, gpu")


def gpu_available() -> bool:
    """Whether cupy imports and sees a CUDA device (never raises)."""
    try:
        from engine.runtime.backends.cupy_backend import import_cupy

        import_cupy()
        return True
    except Exception:
        return False


def gpu_count() -> int:
    """CUDA devices this process sees (0 without cupy or a device; never raises)."""
    try:
        from engine.runtime.backends.cupy_backend import import_cupy

        return int(import_cupy().cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def gpu_memory_bytes(device: int = 0) -> int:
    """Total memory of CUDA device ``device``, in bytes.  A property query: it makes no
    CUDA context, so the process that asks holds no device memory for asking."""
    from engine.runtime.backends.cupy_backend import import_cupy

    cupy = import_cupy()
    return int(cupy.cuda.runtime.getDeviceProperties(device)["totalGlobalMem"])


__all__ = ["Backend", "NumpyBackend", "get_backend", "gpu_available", "gpu_count",
           "gpu_memory_bytes"]
