"""How much Python-visible memory a training step allocates (tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable


def step_allocations(step: Callable[[], None], warmup: int = 10, runs: int = 50
                     ) -> tuple[int, int]:
    """(bytes retained after ``runs`` steps, peak bytes allocated during them), after
    ``warmup`` steps under tracing (bindings and numpy's small caches are made then)."""
    tracemalloc.start()
    try:
        for _ in range(warmup):
            step()
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(runs):
            step()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, peak - before
