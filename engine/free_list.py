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

A range that grows on demand (a heap whose size is the highest address used) takes
from the list with :meth:`FreeList.allocate`: best fit below the top, else at the
top, growing a free segment that ends there.

>>> free = FreeList([(0, 64)])
>>> free.allocate(32, top=64), free.allocate(128, top=64), list(free)
((0, 64), (32, 160), [])
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
        k = self._best(size)
        return None if k < 0 else (self._at[k], self._size[self._at[k]])

    def _best(self, size: int) -> int:
        """Index in ``_at`` of the segment :meth:`best_fit` picks, or -1."""
        best, best_size = -1, 0
        sizes = self._size
        for k, o in enumerate(self._at):
            s = sizes[o]
            if s >= size and (best < 0 or s < best_size):
                best, best_size = k, s
                if s == size:
                    break  # nothing is tighter, and later offsets lose ties
        return best

    def take(self, offset: int, size: int) -> None:
        """Allocate ``size`` bytes from the start of the free segment at ``offset``."""
        have = self._size.get(offset)
        if have is None or have < size:
            raise ValueError(f"no free segment of {size} bytes at offset {offset}")
        self._take(bisect.bisect_left(self._at, offset), size)

    def _take(self, k: int, size: int) -> None:
        """Take ``size`` bytes from the start of segment ``k`` (which holds them)."""
        at, sizes = self._at, self._size
        offset = at[k]
        have = sizes.pop(offset)
        if have > size:  # the rest stays at index k: it lies before the next segment
            at[k] = offset + size
            sizes[offset + size] = have - size
        else:
            del at[k]

    def allocate(self, size: int, top: int) -> tuple[int, int]:
        """Place ``size`` bytes in a range whose bytes from ``top`` up are not in use
        (nor in the list): at the best fit (:meth:`best_fit`) if a segment holds them,
        else at the top, starting at the last free segment if that ends there.
        Returns ``(offset, new top)``."""
        k = self._best(size)
        if k >= 0:
            offset = self._at[k]
            self._take(k, size)
            return offset, top
        at = self._at
        if at and at[-1] + self._size[at[-1]] == top:  # grow the free segment at the top
            offset = at.pop()
            del self._size[offset]
            return offset, offset + size
        return top, top + size

    def release(self, offset: int, size: int) -> None:
        """Return ``[offset, offset + size)`` to the list, merged with its neighbours.
        It must not overlap a free segment."""
        if size <= 0:
            return
        at, sizes = self._at, self._size
        k = bisect.bisect_left(at, offset)
        end = offset + size
        after = at[k] if k < len(at) else -1  # the next free segment's offset
        before = at[k - 1] if k else -1
        if 0 <= after < end or (before >= 0 and before + sizes[before] > offset):
            raise ValueError(f"[{offset}, {end}) overlaps a free segment")
        if after == end:
            size += sizes.pop(after)
            del at[k]
        if before >= 0 and before + sizes[before] == offset:
            sizes[before] += size
        else:
            at.insert(k, offset)
            sizes[offset] = size

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
