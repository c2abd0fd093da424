"""The compiler: a CalcGraph -> validated, optimised, differentiated IR -> a memory plan
-> a :class:`~engine.runtime.program.Program` whose every byte is known.

This layer reads the op table (``engine.ops``) and emits the runtime's program format
(``engine.runtime.program``); the runtime never imports it back.

>>> from engine.compile import compile_graph
>>> from engine.models import paper_mlp
>>> compile_graph(paper_mlp(), batch_size=64).batch_size
64
"""

from engine.compile.compiler import compile_graph, lower, max_batch, size
from engine.compile.dot import to_dot
from engine.compile.passes.pipeline import DEFAULT_PASSES, PASSES, Pass
from engine.compile.stack import stack_graphs, stack_optimizers

__all__ = [
    "DEFAULT_PASSES",
    "PASSES",
    "Pass",
    "compile_graph",
    "lower",
    "max_batch",
    "size",
    "stack_graphs",
    "stack_optimizers",
    "to_dot",
]
