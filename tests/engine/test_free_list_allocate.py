"""FreeList.allocate, the planner's best fit in a range that grows: the same offsets,
tops and free segments as asking best_fit, then taking the segment, the top one
grown, or the top."""

from __future__ import annotations

import random

from engine.free_list import FreeList


def _reference(free: FreeList, size: int, top: int) -> tuple[int, int]:
    fit, last = free.best_fit(size), free.last()
    if fit is not None:
        free.take(fit[0], size)
        return fit[0], top
    if last is not None and last[0] + last[1] == top:
        free.take(*last)
        return last[0], last[0] + size
    return top, top + size


def test_allocate_places_as_best_fit_take_and_growth_would() -> None:
    r = random.Random(35)
    for _ in range(200):
        fast, slow = FreeList(), FreeList()
        top = top_ref = 0
        held: list[tuple[int, int]] = []
        for _ in range(r.randint(1, 80)):
            if held and r.random() < 0.45:
                offset, size = held.pop(r.randrange(len(held)))
                fast.release(offset, size)
                slow.release(offset, size)
            else:
                size = 64 * r.randint(1, 6)
                offset, top = fast.allocate(size, top)
                assert (offset, top) == _reference(slow, size, top_ref)
                top_ref = top
                held.append((offset, size))
            assert list(fast) == list(slow)
        assert all(o + s <= top for o, s in held)


def test_allocate_grows_the_free_segment_at_the_top() -> None:
    free = FreeList([(0, 64), (128, 64)])
    assert free.allocate(32, top=192) == (0, 192)  # tightest: (0, 64), split
    assert free.allocate(96, top=192) == (128, 224)  # none holds 96: grow (128, 64)
    assert list(free) == [(32, 32)]
    assert free.allocate(64, top=224) == (224, 288)  # the last free one is not at the top
