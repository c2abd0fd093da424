"""A data set in shared memory: loaded once by the scheduler, mapped by every worker
without a copy (the workers' arrays are views of the same physical pages).

>>> import numpy as np
>>> with SharedArrays({"x": np.arange(6.0).reshape(2, 3)}) as shm:
...     view = attach(shm.spec)
...     float(view["x"][1, 2])
5.0
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from engine.alignment import align_up


@dataclass(frozen=True)
class ArraySpec:
    shm: str  # shared-memory block name
    offset: int
    shape: tuple[int, ...]
    dtype: str


class SharedArrays:
    """Copies ``arrays`` once into one shared-memory block; ``spec`` tells workers
    where each one is.  Close (or use as a context manager) to free the block."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        sizes = {k: align_up(np.ascontiguousarray(a).nbytes) for k, a in arrays.items()}
        self.block = shared_memory.SharedMemory(create=True, size=max(1, sum(sizes.values())))
        self.spec: dict[str, ArraySpec] = {}
        at = 0
        for k, a in arrays.items():
            a = np.ascontiguousarray(a)
            dst = np.ndarray(a.shape, a.dtype, buffer=self.block.buf, offset=at)
            dst[...] = a
            self.spec[k] = ArraySpec(self.block.name, at, tuple(a.shape), a.dtype.str)
            at += sizes[k]
        self.nbytes = at

    def close(self) -> None:
        self.block.close()
        with contextlib.suppress(FileNotFoundError):
            self.block.unlink()

    def __enter__(self) -> SharedArrays:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_ATTACHED: dict[str, shared_memory.SharedMemory] = {}


def _open(name: str) -> shared_memory.SharedMemory:
    """Map an existing block.  Workers are multiprocessing children and share the
    scheduler's resource tracker, so their registration is the scheduler's own and
    the block is unlinked once, by its owner (Python 3.13 can skip tracking)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    return shared_memory.SharedMemory(name=name)


def attach(spec: dict[str, ArraySpec]) -> dict[str, np.ndarray]:
    """Read-only numpy views of the shared arrays (the block stays mapped for the
    life of the process)."""
    out = {}
    for k, s in spec.items():
        block = _ATTACHED.get(s.shm)
        if block is None:
            block = _open(s.shm)
            _ATTACHED[s.shm] = block
        a = np.ndarray(s.shape, np.dtype(s.dtype), buffer=block.buf, offset=s.offset)
        a.flags.writeable = False
        out[k] = a
    return out
