"""What a run admits: the arithmetic of the budget, in one place.

A budget must hold the scheduler's process, the data (once), multiprocessing's
resource tracker, each worker's measured cost, and for each worker an arena the
space's smallest candidate fits in; what is left is split evenly into arenas.  This
module computes each of those figures and, for a budget that holds none, the message
that says what it takes and the least that would do.
"""

from __future__ import annotations

from engine import BudgetError
from engine.alignment import align_down, align_up
from explore import sampling
from explore.candidate import compile_candidate, user_errors
from explore.scheduler.constants import Measured
from explore.space import Space

# A process's PSS gives it a share of each page it maps with others, and other programs
# (any Python with numpy) map the same libraries: as they start and end, the run's PSS
# moves by a few MB though it allocates nothing.  This much of the budget (at least
# HEADROOM_MIN bytes) is held back for that; growth the run measures uses it first.
HEADROOM = 0.02
HEADROOM_MIN = 2_000_000


# A CUDA device maps memory in pages of 2 MiB and rounds each allocation up to them
# (measured on an H100: a heap's device memory is its planned bytes rounded up to 2 MiB).
# An arena on a GPU is a whole number of pages, so that what it takes is what it holds.
GPU_PAGE = 2 << 20


def arena_size(left: int, device: str) -> int:
    """An arena of at most ``left`` bytes: 64-byte aligned, whole 2 MiB pages on a GPU.

    >>> arena_size(5_000_050, "cpu"), arena_size(5_000_050, "gpu")
    (5000000, 4194304)
    """
    return align_down(left, GPU_PAGE) if device == "gpu" else align_down(left)


def admitted_heap(smallest: int, device: str) -> int:
    """What admitting a candidate of ``smallest`` heap bytes holds back per worker: on
    a GPU whole pages, as its arena will be (:func:`arena_size`), so that a budget that
    admits a worker also gives it an arena the candidate fits in.

    >>> admitted_heap(525_696, "cpu"), admitted_heap(525_696, "gpu")
    (525696, 2097152)
    """
    return align_up(smallest, GPU_PAGE) if device == "gpu" else smallest


def headroom(budget: int) -> int:
    """What of ``budget`` is held back for shared pages' PSS to move in."""
    return max(HEADROOM_MIN, int(budget * HEADROOM))


def smallest_heap(space: Space) -> int:
    """The heap of the space's smallest candidate (every range at its low end) at its
    training batch (batch 1 for ``auto``), as an arena holds it; 0 when that candidate
    fails on its own (its trial then fails when asked for, with its reason)."""
    params = sampling.fixed(space)
    if params["batch_size"] == "auto":
        params["batch_size"] = 1
    # a builder's model is the user's code: what it raises is its trial's failure
    failing: tuple[type[Exception], ...] = (BudgetError, *user_errors(space))
    try:
        cand = compile_candidate(space, params, 1 << 62)
    except failing:
        return 0
    return align_up(min(p.total_bytes for p in cand.fitting()))


def too_small(
    *,
    budget: int,
    devices: int,
    device: str,
    smallest: int,
    known: Measured,
    host_share: int,
    main: int,
    data: int,
) -> str:
    """Why a budget of ``budget`` bytes (on each of ``devices``) holds no worker with an
    arena for the smallest candidate, and the least ``--memory`` that would."""
    heap = admitted_heap(smallest, device)
    need = host_share + heap + known.worker
    # With the headroom, and what the processes measure varies by a fraction of a
    # percent from run to run.
    least = -(-max(need + HEADROOM_MIN, int(need / (1 - HEADROOM))) * 101 // 100 // 1_000_000)
    each = f" on each of {devices} devices" if devices > 1 else ""
    share = (
        f" (each device's share of them: {host_share:,})" if devices > 1 and device == "cpu" else ""
    )
    if device == "gpu":  # the host's processes hold no device memory
        takes = (
            f"{known.worker:,} bytes of device memory for a worker (its CUDA "
            f"context and libraries) and {heap:,} for the smallest candidate of "
            f"the space ({smallest:,} bytes, in whole 2 MiB pages)"
        )
    else:
        takes = (
            f"{main:,} bytes for the scheduler, {data:,} for the data, "
            f"{known.tracker:,} for multiprocessing's resource tracker{share}, "
            f"{known.worker:,} for a worker and {smallest:,} for the smallest "
            f"candidate of the space"
        )
    return (
        f"a budget of {budget:,} bytes{each} cannot hold this run: it "
        f"takes {takes}, {need:,} in all{each}; --memory {least}MB is the least "
        f"that would do"
    )
