"""An arena gives back the pages of a part no model uses: the memory the system counts
for it falls at once, and the part is usable again."""

from __future__ import annotations

import mmap
import os

import pytest

from engine.errors import EngineError
from engine.runtime.arena import Arena


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_released_pages_stop_counting_and_read_as_zeros() -> None:
    arena = Arena(64 << 20)
    before = _rss()
    arena.buffer[: 48 << 20] = 7
    touched = _rss()
    assert touched - before >= 47 << 20
    given = arena.release(100, 40 << 20)  # whole pages only: the first is kept
    assert given == (100 + (40 << 20)) // mmap.PAGESIZE * mmap.PAGESIZE - mmap.PAGESIZE
    assert touched - _rss() >= 39 << 20
    assert arena.buffer[99] == 7 and arena.buffer[mmap.PAGESIZE] == 0
    assert arena.buffer[(44 << 20)] == 7  # past the range: untouched
    arena.buffer[: 8 << 20] = 1  # usable again
    assert int(arena.buffer[: 8 << 20].sum()) == 8 << 20


def test_a_range_outside_the_arena_is_an_error() -> None:
    arena = Arena(1 << 20)
    with pytest.raises(EngineError, match="cannot release"):
        arena.release(1 << 19, 1 << 20)
    assert arena.release(0, 100) == 0  # less than a page: nothing to give back
