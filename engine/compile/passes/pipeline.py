"""The graph-optimisation pipeline: the pass list is data.

Each :class:`Pass` is a name, a function ``IR -> IR`` and a line of doc.
``compile_graph(..., passes=...)`` takes the names (or Pass objects) to run, in
order: ``passes=()`` compiles the graph as written, ``DEFAULT_PASSES`` is the
default.  With ``debug=True`` the verifier runs after every pass and names the
pass that broke the graph.

>>> DEFAULT_PASSES  # doctest: +NORMALIZE_WHITESPACE
['dce', 'fold_constants', 'simplify', 'cse', 'pool_activation', 'fuse_gemm',
 'fuse_activation', 'fuse_dequantize', 'dce']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.compile.passes.commute import commute_pool_activation
from engine.compile.passes.cse import eliminate_common_subexpressions
from engine.compile.passes.dce import eliminate_dead_code
from engine.compile.passes.fold import fold_constants
from engine.compile.passes.fuse import fuse_activation, fuse_dequantize, fuse_gemm
from engine.compile.passes.ir import IR
from engine.compile.passes.shapes import typecheck
from engine.compile.passes.simplify import simplify
from engine.errors import CompileError


@dataclass(frozen=True)
class Pass:
    """One graph optimisation."""

    name: str
    run: Callable[[IR], IR]
    doc: str = ""


PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("dce", eliminate_dead_code, "drop nodes and constants nothing needs"),
    Pass("fold_constants", fold_constants, "precompute pure nodes of constants"),
    Pass("simplify", simplify, "remove algebraic no-ops; merge reshape and transpose pairs"),
    Pass("cse", eliminate_common_subexpressions, "reuse identical pure nodes in a path"),
    Pass("pool_activation", commute_pool_activation,
         "MaxPool(Relu(X)) -> Relu(MaxPool(X)), where exact"),
    Pass("fuse_gemm", fuse_gemm, "MatMul + bias Add -> Gemm"),
    Pass("fuse_activation", fuse_activation, "Gemm + Relu/Sigmoid/Tanh -> FusedGemm"),
    Pass("fuse_dequantize", fuse_dequantize,
         "DequantizeLinear into the rows of a Gemm -> DequantizeGemm"),
)}

DEFAULT_PASSES: list[str] = ["dce", "fold_constants", "simplify", "cse", "pool_activation",
                             "fuse_gemm", "fuse_activation", "fuse_dequantize", "dce"]

PassList = Sequence["str | Pass"] | None


def resolve_passes(passes: PassList) -> list[Pass]:
    """The Pass objects of a list of names or passes (``None``: the defaults)."""
    out = []
    for p in DEFAULT_PASSES if passes is None else passes:
        if isinstance(p, Pass):
            out.append(p)
        elif p in PASSES:
            out.append(PASSES[p])
        else:
            raise CompileError(f"unknown pass {p!r}; passes: {', '.join(PASSES)}")
    return out


def run_passes(ir: IR, passes: PassList = None, debug: bool = False) -> IR:
    """Run ``passes`` over ``ir``; with ``debug``, verify the IR after each."""
    for p in resolve_passes(passes):
        ir = p.run(ir)
        if debug:
            typecheck(ir, p.name)
    return ir
