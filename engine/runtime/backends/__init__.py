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


__all__ = ["Backend", "NumpyBackend", "get_backend", "gpu_available"]
