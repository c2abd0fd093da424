"""Packing buffers with lifetimes into one address range (2-D strip packing).

An *item* is ``(start, end, size)``: the buffer is live at every instruction index
``start..end`` (inclusive) and needs ``size`` bytes.  A packing gives each item an
offset such that items live at a common instruction never overlap in memory; its
cost is the highest address used.  Two strategies, both measured by
``bench/planner.py``:

- :func:`best_fit`: walk the instructions in order, like an allocator
  that knows the future frees: a buffer takes the smallest free block that holds it
  (or extends the block at the top), and is freed after its last reader, with
  neighbouring free blocks merged (:class:`engine.free_list.FreeList`, which the
  explore scheduler uses for its workers' arenas too).  O(n log n) plus the scan of
  the free list, which stays short because lifetimes nest (forward activations die in
  reverse order).
- :func:`greedy_by_size` (TFLite's "greedy by size"): largest buffer first, each into
  the smallest gap between the already-placed buffers that overlap it in time.

The default, :func:`auto`, runs best fit and, when that misses the lower bound on a
graph small enough, greedy by size, and keeps the smaller.

:func:`lower_bound` is the most bytes live at any one instruction: no packing of
these items can use less.

>>> items = [(0, 1, 64), (1, 2, 64), (2, 3, 64)]      # a chain: a -> b -> c -> ...
>>> best_fit(items), lower_bound(items)
(([0, 64, 0], 128), 128)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import itemgetter

import numpy as np

from engine.free_list import FreeList

Item = tuple[int, int, int]  # (start, end, size)
Packing = tuple[list[int], int]  # offsets, bytes used
Strategy = Callable[[Sequence[Item]], Packing]


def lower_bound(items: Sequence[Item]) -> int:
    """Largest sum of sizes live at one instruction."""
    if not items:
        return 0
    events: dict[int, int] = {}
    for s, e, z in items:
        events[s] = events.get(s, 0) + z
        events[e + 1] = events.get(e + 1, 0) - z
    return max(accumulate(events[t] for t in sorted(events)))


def best_fit(items: Sequence[Item]) -> Packing:
    offsets, top, _ = _best_fit(items)
    return offsets, top


def _best_fit(items: Sequence[Item]) -> tuple[list[int], int, int]:
    """:func:`best_fit`'s packing, and the lower bound: the walk visits every
    instruction's births before its deaths, so the most bytes it holds live at once
    is :func:`lower_bound`."""
    n = len(items)
    offsets = [0] * n
    starts = [it[0] for it in items]
    ends = [it[1] for it in items]
    sizes = [it[2] for it in items]
    # Births by start, the larger first, then by index; deaths by end, then by index
    # (stable sorts on list lookups: no key tuple per item).
    born = sorted(range(n), key=[-z for z in sizes].__getitem__)
    born.sort(key=starts.__getitem__)
    dies = sorted(range(n), key=ends.__getitem__)
    born_at = [starts[i] for i in born]
    dies_at = [ends[i] for i in dies]
    free = FreeList()
    allocate, release = free.allocate, free.release
    top = live = bound = 0
    b = d = 0
    while d < n:
        # Births at an instruction come before deaths at it: both are live there.
        if b < n and born_at[b] <= dies_at[d]:
            i = born[b]
            b += 1
            need = sizes[i]
            offsets[i], top = allocate(need, top)
            live += need
            if live > bound:
                bound = live
        else:
            i = dies[d]
            d += 1
            release(offsets[i], sizes[i])
            live -= sizes[i]
    return offsets, top, bound


SMALL = 64  # below this many items, greedy by size runs on Python lists, not arrays


def greedy_by_size(items: Sequence[Item]) -> Packing:
    n = len(items)
    if not n:
        return [], 0
    order = sorted(range(n), key=lambda i: (-items[i][2], items[i][0], i))
    if n <= SMALL:
        return _greedy_lists(items, order)
    # Placed items in placement order, as arrays: the overlap test is vectorised,
    # which is what keeps this O(n^2) method usable at 10^4 buffers.
    st = np.array([items[i][0] for i in order], np.int64)
    en = np.array([items[i][1] for i in order], np.int64)
    sz = np.array([items[i][2] for i in order], np.int64)
    off = np.zeros(n, np.int64)
    for k in range(n):
        need = int(sz[k])
        hit = (st[:k] <= en[k]) & (en[:k] >= st[k])
        if not hit.any():
            continue  # offset 0
        lo = off[:k][hit]
        rank = np.argsort(lo, kind="stable")
        lo = lo[rank]
        hi = lo + sz[:k][hit][rank]
        reach = np.maximum.accumulate(hi)  # highest address below each gap's end
        before = np.concatenate(([0], reach[:-1]))
        gaps = lo - before
        fits = np.flatnonzero(gaps >= need)
        if fits.size:
            off[k] = before[fits[np.argmin(gaps[fits])]]
        else:
            off[k] = reach[-1]
    offsets = [0] * n
    for k, i in enumerate(order):
        offsets[i] = int(off[k])
    return offsets, int((off + sz).max())


def _greedy_lists(items: Sequence[Item], order: list[int]) -> Packing:
    """:func:`greedy_by_size` on lists, for a few items (the max-batch search packs a
    small model's zones dozens of times, and each numpy call costs more than a list
    step): each item, in ``order``, into the smallest gap between the placed items
    that overlap it in time (the lowest of equal gaps), else above them."""
    offsets = [0] * len(items)
    placed: list[tuple[int, int, int, int]] = []  # (offset, top, start, end), in order
    top = 0
    for i in order:
        s, e, need = items[i]
        # The overlapping ones by offset (stable: placement order among equal offsets).
        busy = sorted([(lo, hi) for lo, hi, ps, pe in placed if ps <= e and pe >= s],
                      key=itemgetter(0))
        at, best, reach = 0, -1, 0
        for lo, hi in busy:
            gap = lo - reach  # the free bytes below this one, above all before it
            if gap >= need and (best < 0 or gap < best):
                at, best = reach, gap
            reach = max(reach, hi)
        if busy and best < 0:
            at = reach
        offsets[i] = at
        placed.append((at, at + need, s, e))
        top = max(top, at + need)
    return offsets, top


GREEDY_LIMIT = 2048


def auto(items: Sequence[Item]) -> Packing:
    """Best fit; where it misses the lower bound and there are at most
    ``GREEDY_LIMIT`` items, greedy by size too, keeping the smaller packing.  On the
    benchmark suite greedy by size is never worse in bytes but is O(n^2): at 10^4
    buffers well over ten times best fit's time (``docs/measurements.md``), and the
    max-batch search plans ~40 times."""
    offsets, top, _ = _auto(items)
    return offsets, top


def _auto(items: Sequence[Item]) -> tuple[list[int], int, int]:
    offsets, top, bound = _best_fit(items)
    if len(items) <= GREEDY_LIMIT and top > bound:
        other = greedy_by_size(items)
        if other[1] < top:
            return *other, bound
    return offsets, top, bound


STRATEGIES: dict[str, Strategy] = {"auto": auto, "best_fit": best_fit,
                                   "greedy_by_size": greedy_by_size}


def pack(strategy: str, items: Sequence[Item]) -> tuple[list[int], int, int]:
    """``STRATEGIES[strategy](items)`` and :func:`lower_bound` of the items: the offsets,
    the bytes used and the least any packing could use (best fit finds the bound as it
    goes).

    >>> pack("auto", [(0, 1, 64), (1, 2, 64), (2, 3, 64)])
    ([0, 64, 0], 128, 128)
    """
    if strategy == "auto":
        return _auto(items)
    if strategy == "best_fit":
        return _best_fit(items)
    return *STRATEGIES[strategy](items), lower_bound(items)
