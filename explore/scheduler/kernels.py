"""Which kernels a run's workers use: numpy's, or the engine's fused ones compiled by
numba (:mod:`engine.ops.jit`), as the space's ``budget.kernels`` says.

The fused kernels are 1.1-13x faster per op (an optimizer's update over a stack of
models about four times faster), but numba's LLVM is about 100 MB of each worker's
measured overhead (``docs/measurements.md``), memory the budget then holds for no
trial, and importing it and loading the cached kernels adds about 0.35 s to a worker's
start.  ``auto`` therefore compiles only where that memory is small beside a worker's
share of the budget (at least :data:`COMPILED_FROM` bytes each); an explicit
``CALCGRAPH_JIT`` in the environment is kept, as for any engine program.

>>> for_workers("auto", 1_000_000_000, 2, {}), for_workers("auto", 512_000_000, 2, {})
('1', '0')
>>> for_workers("compiled", 64 << 20, 2, {}), for_workers("numpy", 4 << 30, 2, {})
('1', '0')
>>> for_workers("auto", 4 << 30, 2, {"CALCGRAPH_JIT": "0"})
'0'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from engine.ops.jit import ENV

COMPILED_FROM = 500_000_000
"""A worker's share of the budget from which ``kernels: auto`` compiles: numba's LLVM
(about 100 MB a worker) is then a fifth of it at most.  The shipped paper and CNN
spaces (1 GB for two workers) ran 10-15% faster compiled, within their budgets
(``docs/measurements.md``); a share half that size would give a third of itself."""

KERNELS = ("auto", "numpy", "compiled")


def for_workers(kernels: str, memory: int, workers: int,
                environ: Mapping[str, str] | None = None, device: str = "cpu") -> str:
    """The worker processes' ``CALCGRAPH_JIT`` ("1": compiled, "0": numpy) for a run
    whose ``budget.kernels`` is ``kernels`` and whose ``workers`` share ``memory``
    bytes (on each device).  On a GPU the fused kernels never run (they are the host's),
    so numba is not loaded there."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
    if device != "cpu":
        return "0"
    if kernels != "auto":
        return jit_of(kernels)
    env = os.environ if environ is None else environ
    if env.get(ENV) is not None:
        return "0" if env[ENV] == "0" else "1"
    return "1" if memory // max(workers, 1) >= COMPILED_FROM else "0"


def jit_of(kernels: str) -> str:
    """The ``CALCGRAPH_JIT`` of a record's ``kernels`` (numpy or compiled)."""
    return "1" if kernels == "compiled" else "0"


def kernels_of(jit: str) -> str:
    """What a ``CALCGRAPH_JIT`` value runs, as records say it: numpy or compiled."""
    return "numpy" if jit == "0" else "compiled"


@contextlib.contextmanager
def jit_set(jit: str) -> Iterator[None]:
    """``CALCGRAPH_JIT`` set to ``jit`` while the block runs: the kernels a VM binds
    in it, and those of worker processes spawned in it (they take this process's
    environment as it is when they start)."""
    saved = os.environ.get(ENV)
    os.environ[ENV] = jit
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved
