"""The free segments of one address range, kept by offset with neighbours merged.

One allocator for two users: the memory planner's best-fit packing
(:func:`engine.compile.packing.best_fit`, offsets inside a heap) and the explore
scheduler's mirror of each worker's arena (offsets of trial heaps inside the arena).
Both want the same policy, *best fit*: the tightest segment that holds a request,
the lowest offset among equally tight ones.

>>> free = FreeList([(0, 256)])
>>> free.take(0, 64); free.take(64, 128); free.release(0, 64)
>>> list(free), free.best_fit(32)
([(0, 64), (192, 64)], (0, 64))
>>> free.release(64, 128); list(free)
[(0, 256)]
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


class FreeList:
    """Free segments ``(offset, size)``, disjoint, by offset, never two adjacent ones
    (a release merges a segment with its neighbours).  Sizes are bytes; the list does
    not align them (its users do)."""

    def __init__(self, segments: Iterable[tuple[int, int]] = ()) -> None:
        self._at: list[int] = []  # offsets of the free segments, ascending
        self._size: dict[int, int] = {}
        for offset, size in segments:
            self.release(offset, size)

    def best_fit(self, size: int) -> tuple[int, int] | None:
        """``(offset, segment_size)`` of the tightest free segment that holds ``size``
        bytes (the lowest offset among equals), or None."""
        best, best_size = -1, 0
        for o in self._at:
            s = self._size[o]
            if s >= size and (best < 0 or s < best_size):
                best, best_size = o, s
                if s == size:
                    break  # nothing is tighter, and later offsets lose ties
        return None if best < 0 else (best, best_size)

    def take(self, offset: int, size: int) -> None:
        """Allocate ``size`` bytes from the start of the free segment at ``offset``."""
        have = self._size.get(offset)
        if have is None or have < size:
            raise ValueError(f"no free segment of {size} bytes at offset {offset}")
        self._at.pop(bisect.bisect_left(self._at, offset))
        del self._size[offset]
        if have > size:
            bisect.insort(self._at, offset + size)
            self._size[offset + size] = have - size

    def release(self, offset: int, size: int) -> None:
        """Return ``[offset, offset + size)`` to the list, merged with its neighbours.
        It must not overlap a free segment."""
        if size <= 0:
            return
        k = bisect.bisect_left(self._at, offset)
        if (k < len(self._at) and self._at[k] < offset + size) or \
                (k > 0 and self._at[k - 1] + self._size[self._at[k - 1]] > offset):
            raise ValueError(f"[{offset}, {offset + size}) overlaps a free segment")
        if k < len(self._at) and self._at[k] == offset + size:
            size += self._size.pop(self._at.pop(k))
        if k > 0 and self._at[k - 1] + self._size[self._at[k - 1]] == offset:
            self._size[self._at[k - 1]] += size
        else:
            self._at.insert(k, offset)
            self._size[offset] = size

    def last(self) -> tuple[int, int] | None:
        """The free segment at the highest offset, or None."""
        return (self._at[-1], self._size[self._at[-1]]) if self._at else None

    @property
    def free_bytes(self) -> int:
        return sum(self._size.values())

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((o, self._size[o]) for o in self._at)

    def __len__(self) -> int:
        return len(self._at)

    def __repr__(self) -> str:
        return f"FreeList({list(self)})"
