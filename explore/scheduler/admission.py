"""What a run admits: whether a space, its data and its budget can run, in one place.

Before any study or shared file exists (:func:`admit`, called by
:func:`explore.runner.prepare`): the data's rows must fit the budget on their own, the
space's first candidate must make a model of the data, and that candidate (every range
at its low end) is compiled once, its heap the least an arena must hold.  When the
workers start (:class:`~.loop.Scheduler`): a budget must hold the scheduler's process,
the data (once), multiprocessing's resource tracker, each worker's measured cost, and
for each worker an arena of at least that heap; what is left is split evenly into
arenas.  A budget that holds none is refused with what it takes and the least
``--memory`` that would do (:func:`too_small`).

The schema (``budget.memory`` against the machine's memory) and the compiler
(:func:`engine.compile.compiler.check_fits_machine`, a guard against plans no machine
could hold) check their own layers' limits; what a run admits is decided here.
"""

from __future__ import annotations

from typing import Any

from engine import BeyondMachineError, BudgetError
from engine.alignment import align_down, align_up
from explore import sampling
from explore.binding import BoundSpace
from explore.candidate import compile_candidate, graph_of, user_errors
from explore.families import OutputMismatch
from explore.ranges import Choice
from explore.scheduler.constants import Measured
from explore.space import Space

# A process's PSS gives it a share of each page it maps with others, and other programs
# (any Python with numpy) map the same libraries: as they start and end, the run's PSS
# moves by a few MB though it allocates nothing.  This much of the budget (at least
# HEADROOM_MIN bytes) is held back for that; growth the run measures uses it first.
HEADROOM = 0.02
HEADROOM_MIN = 2_000_000
LEAST_MARGIN_PCT = 5  # over the least --memory a refusal names (see too_small)


# A CUDA device maps memory in pages of 2 MiB and rounds each allocation up to them
# (a heap's device memory is its planned bytes rounded up to 2 MiB: docs/measurements.md).
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


class Refused(ValueError):
    """The run cannot be admitted; the message says why and what would do.  ``key``:
    the space's key at fault (``("model",)``), which the message starts with, so that
    a caller holding the space's file can point at its line
    (:meth:`explore.space.Space.error_at`)."""

    def __init__(self, message: str, key: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.key = key


def admit(bound: BoundSpace) -> int:
    """Check that ``bound``'s space can run on its data set within its budget
    (:class:`Refused` otherwise); the heap of its smallest candidate, compiled once (0
    when the user's builder fails on it: that trial then fails when asked for, with its
    reason)."""
    check_data_size(bound.space, bound.data)
    graph = None
    try:
        graph = graph_of(bound, sampling.fixed(bound.space))
    except OutputMismatch as e:  # no trial's model would suit the data's classes
        raise Refused(f"model: {e}", ("model",)) from None
    except user_errors(bound) as e:  # a family that does not suit the data, say
        if not bound.uses_builder:
            raise Refused(f"model: {e}", ("model",)) from None
        # the user's code: each trial's failure is its own, said when it is asked for
    return smallest_heap(bound, graph)


def check_data_size(space: Space, ds: Any) -> None:
    """The run's rows of a table, as the workers share them (float32 features, or uint8
    pixels, and the targets), must fit the budget on their own: refused before the
    study and the shared file exist, not by the memory they would exhaust."""
    rows = getattr(ds, "rows", None)
    if rows is None:
        return  # a built-in set: the scheduler's accounting sizes it
    heads = space.dataset.heads if space.dataset is not None else (None, None)
    n = sum(r if h is None else min(h, r) for r, h in zip(rows[:2], heads, strict=True))
    per_row = int(ds.features) * (1 if getattr(ds, "pixel_scale", None) else 4) + 8
    need = n * per_row
    if need > space.budget.memory:
        raise Refused(f"dataset: its {n:,} training and validation rows of "
                      f"{int(ds.features):,} features take {need:,} bytes in memory, "
                      f"more than the budget of {space.budget.memory:,} bytes; raise "
                      "budget.memory or use fewer rows (dataset.train, dataset.valid)",
                      ("dataset",))


def smallest_heap(bound: BoundSpace, graph: Any = None) -> int:
    """The heap of the space's smallest candidate (every range at its low end) at its
    training batch (batch 1 for ``auto``), as an arena holds it; 0 when that candidate
    fails on its own (its trial then fails when asked for, with its reason).  ``graph``:
    the candidate's, when built already."""
    params = sampling.fixed(bound.space)
    if params["batch_size"] == "auto":
        params["batch_size"] = 1
    # a builder's model is the user's code: what it raises is its trial's failure
    failing: tuple[type[Exception], ...] = (BudgetError, *user_errors(bound))
    try:
        cand = compile_candidate(bound, params, 1 << 62, graph=graph)
    except BeyondMachineError as e:  # no budget holds the least of the space's models
        if bound.uses_builder or any(isinstance(r, Choice) for r in
                                     bound.space.params().values()):
            return 0  # a choice's first value need not be its smallest: trials say
        raise Refused(f"model: its smallest candidate (every range at its low end) does "
                      f"not fit this machine: {e}", ("model",)) from None
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
    # With the headroom, and a margin for what the processes measure from run to run:
    # a library page's PSS is split among the processes mapping it, so a worker measured
    # beside another (or while other programs load the same libraries) reads lower than
    # one alone, by a percent or more of the whole.
    least = -(-max(need + HEADROOM_MIN, int(need / (1 - HEADROOM))) * (100 + LEAST_MARGIN_PCT)
              // 100 // 1_000_000)
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
