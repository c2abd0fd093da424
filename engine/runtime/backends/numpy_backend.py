"""The CPU backend: numpy."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from engine.runtime.backends._base import Backend


class NumpyBackend(Backend):
    name = "cpu"
    xp = np

    def alloc_arena(self, nbytes: int) -> np.ndarray:
        """Anonymous pages of their own (not the malloc heap), so that :meth:`release`
        can hand any whole page of them back to the kernel."""
        n = int(nbytes)
        # Private: on a shared anonymous map (mmap's default) MADV_DONTNEED only unmaps,
        # and the pages live on in shared memory, counted by no process.
        pages = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(pages, np.uint8, count=n)

    def release(self, buf: np.ndarray, offset: int, nbytes: int) -> int:
        """``madvise(MADV_DONTNEED)`` on the whole pages inside the range of an arena from
        :meth:`alloc_arena`: they stop counting in the process's memory (resident and
        proportional set size) at once, and read as zeros if touched again.  A finished
        trial's part of an arena is given back so, and the arena holds in memory only
        what its trials use now."""
        base = buf.base
        pages = base.obj if isinstance(base, memoryview) else base
        if not isinstance(pages, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        start = -(-int(offset) // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (int(offset) + int(nbytes)) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= start:
            return 0
        pages.madvise(mmap.MADV_DONTNEED, start, end - start)
        return end - start

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(int(nbytes), dtype=np.uint8)

    def to_device(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="same_kind")

    def gather_rows(self, dst: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
        # mode="clip": the default ("raise") copies through a temporary buffer, twice
        # the time and an allocation; VM.gather has checked the rows already.
        np.take(src, rows, axis=0, out=dst, mode="clip")

    def to_host(self, src: np.ndarray) -> np.ndarray:
        return np.array(src, copy=True)

    def rng(self, seed: int) -> Any:
        return np.random.default_rng(seed)
