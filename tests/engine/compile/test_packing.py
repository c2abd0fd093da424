"""The packing strategies: never two buffers live at once in the same bytes, never
below the lower bound, and the textbook cases exactly."""

from __future__ import annotations

import random

import pytest

from engine.compile.packing import STRATEGIES, Item, best_fit, greedy_by_size, lower_bound


def assert_valid(items: list[Item], offsets: list[int], total: int) -> None:
    for i, (s, e, z) in enumerate(items):
        assert offsets[i] >= 0 and offsets[i] + z <= total
        for j in range(i):
            s2, e2, z2 = items[j]
            if s <= e2 and s2 <= e:  # live at a common instruction
                assert offsets[i] + z <= offsets[j] or offsets[j] + z2 <= offsets[i], (i, j)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_random_lifetimes_never_overlap(strategy: str) -> None:
    r = random.Random(strategy)
    for _ in range(300):
        items = []
        for _ in range(r.randint(1, 40)):
            s = r.randint(0, 30)
            items.append((s, s + r.randint(0, 12), 64 * r.randint(1, 9)))
        offsets, total = STRATEGIES[strategy](items)
        assert_valid(items, offsets, total)
        assert total >= lower_bound(items)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_chain_needs_two_buffers(strategy: str) -> None:
    items = [(i, i + 1, 256) for i in range(100)]
    assert STRATEGIES[strategy](items)[1] == 512 == lower_bound(items)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_nested_lifetimes_pack_to_the_bound(strategy: str) -> None:
    # A forward/backward pattern: activation i lives from step i to step 2n - i.
    n = 50
    items = [(i, 2 * n - i, 64 * (1 + i % 5)) for i in range(n)]
    items += [(t, t + 1, 128) for t in range(n, 2 * n)]  # short backward temporaries
    offsets, total = STRATEGIES[strategy](items)
    assert_valid(items, offsets, total)
    assert total == lower_bound(items)


def test_lower_bound_is_the_peak_of_live_bytes() -> None:
    assert lower_bound([]) == 0
    assert lower_bound([(0, 0, 64), (1, 1, 128)]) == 128
    assert lower_bound([(0, 2, 64), (1, 1, 128), (2, 3, 64)]) == 192


def test_greedy_by_size_fills_the_gap_best_fit_leaves() -> None:
    # Best fit, walking in time, puts the small early buffer at 0 and cannot later
    # fit the big one into the hole; largest-first can.
    items = [(0, 0, 64), (0, 1, 128), (1, 2, 192)]
    assert greedy_by_size(items)[1] == lower_bound(items) == 320
    assert best_fit(items)[1] >= greedy_by_size(items)[1]
