"""A candidate: sampled parameters compiled into a program of exactly known size.

Compiling is cheap (milliseconds) and touches no device memory, so the scheduler
compiles every candidate before deciding where — or whether — it runs.

>>> from explore.space import parse_space
>>> from explore.sampling import fixed
>>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
...     "memory": "64MB"}, "training": {"batch_size": "auto", "auto_max_batch": 128}})
>>> c = compile_candidate(space, fixed(space), share=4_000_000)
>>> c.program.batch_size, c.program.total_bytes <= 4_000_000
(128, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import BudgetError, Program, compile_graph
from explore.builders import build_graph, build_optimizer
from explore.space import Space

# (features, classes) of each dataset: known without loading it
DIMS = {"mnist": (784, 10), "digits": (64, 10)}


@dataclass
class Candidate:
    params: dict[str, Any]
    program: Program

    @property
    def heap_bytes(self) -> int:
        return self.program.total_bytes


def compile_candidate(space: Space, params: dict[str, Any], share: int) -> Candidate:
    """Compile ``params``; ``batch_size: auto`` takes the largest batch whose heap fits
    ``share`` bytes (at most ``training.auto_max_batch``).  Raises
    :class:`~engine.BudgetError` when even batch 1 does not fit."""
    n_in, n_classes = DIMS[space.dataset.name]
    graph = build_graph(params, n_in, n_classes)
    opt = build_optimizer(params)
    device = space.budget.device
    bs = params["batch_size"]
    if bs == "auto":
        prog = compile_graph(graph, memory=share, optimizer=opt, device=device)
        cap = space.training.auto_max_batch
        if prog.batch_size > cap:
            prog = compile_graph(graph, batch_size=cap, optimizer=opt, device=device)
    else:
        prog = compile_graph(graph, batch_size=int(bs), optimizer=opt, device=device)
        if prog.total_bytes > share:
            raise BudgetError(f"the model needs {prog.total_bytes:,} bytes at batch {bs}; a "
                              f"worker's arena holds {share:,}")
    return Candidate(params, prog)


def max_batch(space: Space, params: dict[str, Any], memory: int) -> int:
    """The largest batch whose heap fits ``memory`` bytes."""
    n_in, n_classes = DIMS[space.dataset.name]
    return compile_graph(build_graph(params, n_in, n_classes), memory=memory,
                         optimizer=build_optimizer(params), device=space.budget.device
                         ).batch_size
