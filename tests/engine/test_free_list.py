"""The free list shared by the planner's packing and the scheduler's arenas: best fit
(tightest, then lowest offset), merging on release, and agreement with a plain model
of the same range over random takes and releases."""

from __future__ import annotations

import random

import pytest

from engine.free_list import FreeList


def test_best_fit_takes_the_tightest_then_the_lowest_offset() -> None:
    free = FreeList([(0, 100), (200, 50), (300, 50), (400, 80)])
    assert free.best_fit(40) == (200, 50)
    assert free.best_fit(60) == (400, 80)
    assert free.best_fit(100) == (0, 100)
    assert free.best_fit(101) is None


def test_take_splits_and_release_merges_both_neighbours() -> None:
    free = FreeList([(0, 300)])
    free.take(0, 100)
    free.take(100, 100)
    assert list(free) == [(200, 100)]
    free.release(0, 100)
    assert list(free) == [(0, 100), (200, 100)]
    free.release(100, 100)
    assert list(free) == [(0, 300)] and free.free_bytes == 300 and len(free) == 1


def test_a_whole_segment_taken_leaves_no_empty_segment() -> None:
    free = FreeList([(0, 64), (128, 64)])
    free.take(128, 64)
    assert list(free) == [(0, 64)] and free.last() == (0, 64)
    free.take(0, 64)
    assert list(free) == [] and free.last() is None


def test_errors_say_what_is_wrong() -> None:
    free = FreeList([(0, 128)])
    with pytest.raises(ValueError, match="no free segment of 256 bytes at offset 0"):
        free.take(0, 256)
    with pytest.raises(ValueError, match="no free segment"):
        free.take(64, 8)
    with pytest.raises(ValueError, match="overlaps"):
        free.release(64, 128)


def test_random_takes_and_releases_match_a_byte_map() -> None:
    r = random.Random(0)
    size = 4096
    free = FreeList([(0, size)])
    used = [False] * size
    held: list[tuple[int, int]] = []
    for _ in range(2000):
        if held and r.random() < 0.45:
            o, s = held.pop(r.randrange(len(held)))
            free.release(o, s)
            used[o:o + s] = [False] * s
        else:
            need = r.randint(1, 300)
            fit = free.best_fit(need)
            # The model: maximal runs of free bytes, the tightest that holds `need`.
            runs, o = [], 0
            while o < size:
                if used[o]:
                    o += 1
                    continue
                e = o
                while e < size and not used[e]:
                    e += 1
                runs.append((o, e - o))
                o = e
            assert list(free) == runs
            fits = [(s, o) for o, s in runs if s >= need]
            assert fit == (None if not fits else min(fits)[::-1])
            if fit is not None:
                free.take(fit[0], need)
                assert not any(used[fit[0]:fit[0] + need])
                used[fit[0]:fit[0] + need] = [True] * need
                held.append((fit[0], need))
    assert free.free_bytes == used.count(False)
