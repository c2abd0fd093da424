"""The device interface: what a backend must provide.  Kernels are written against
the array module ``xp``; a backend adds only allocation, copies and randomness."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class Backend(ABC):
    """One device.  Objects of this class stay in the process that made them."""

    name: str
    xp: Any

    @abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """One contiguous uint8 buffer of exactly ``nbytes`` bytes."""

    def alloc_arena(self, nbytes: int) -> Any:
        """Like :meth:`alloc`, for an arena whose parts :meth:`release` may give back."""
        return self.alloc(nbytes)

    def release(self, buf: Any, offset: int, nbytes: int) -> int:
        """Give the memory of ``buf[offset:offset + nbytes]`` back to the system while
        keeping the range usable (it reads as zeros, or as anything, when used again);
        returns the bytes given back.  Device memory stays allocated: 0."""
        return 0

    def memset(self, buf: Any, value: int = 0) -> None:
        buf.fill(value)

    @abstractmethod
    def to_device(self, dst: Any, src: np.ndarray) -> None:
        """Copy host data into a device view (same shape)."""

    def gather_rows(self, dst: Any, src: np.ndarray, rows: np.ndarray) -> None:
        """``dst[...] = src[rows]`` (host ``src``, device ``dst``)."""
        self.to_device(dst, src[rows])

    @abstractmethod
    def to_host(self, src: Any) -> np.ndarray:
        """A host copy of a device view."""

    @abstractmethod
    def rng(self, seed: int) -> Any:
        """A generator with ``random(out=, dtype=)`` drawing on this device."""

    def host_alloc(self, nbytes: int) -> np.ndarray:
        """Host memory for paused models (page-locked where the device copies faster
        from it)."""
        return np.empty(int(nbytes), dtype=np.uint8)

    def copy_out(self, dst: np.ndarray, src: Any) -> None:
        """Device bytes -> host bytes (same length); may return before it is done:
        :meth:`synchronize` waits."""
        np.copyto(dst, src)

    def copy_in(self, dst: Any, src: np.ndarray) -> None:
        """Host bytes -> device bytes (same length); may be asynchronous like copy_out."""
        np.copyto(dst, src)

    def rng_state(self, rng: Any) -> Any:
        """A JSON-able snapshot of a generator's state."""
        return rng.bit_generator.state

    def set_rng_state(self, rng: Any, state: Any) -> None:
        """Restore a snapshot, in place: kernels hold the generator object."""
        rng.bit_generator.state = state

    def synchronize(self) -> None:  # noqa: B027 - a no-op by default, on purpose
        """Wait for queued device work (no-op on the CPU)."""

    def allocated_bytes(self, bufs: list[Any]) -> int:
        return int(sum(b.nbytes for b in bufs))
