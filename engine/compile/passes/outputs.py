"""Which values the user reads back: they are never shared, and dead-code
elimination keeps what they need.

The graph's declared outputs (:meth:`~engine.graph.CalcGraph.output`), or every
leaf when none is declared, plus each path's loss and whatever ``keep=`` names at
compile time (``keep="all"``: every variable, for debugging).
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.compile.passes.ir import IR
from engine.compile.passes.rewrite import readers
from engine.errors import CompileError
from engine.graph import CalcGraph, Kind

Keep = Iterable[str] | str | None


def mark_outputs(ir: IR, graph: CalcGraph, keep: Keep = None) -> IR:
    generic = [n for n, v in graph.variables.items() if v.kind is Kind.GENERIC]
    if keep == "all":
        ir.keep = set(generic)
    else:
        extra = [keep] if isinstance(keep, str) else list(keep or ())
        for name in extra:
            if name not in ir.descs:
                raise CompileError(f"keep= names {name!r}, which is not a variable of graph "
                                   f"{graph.name!r}")
        if graph.outputs:
            ir.keep = set(graph.outputs)
        else:
            read = readers(ir)
            ir.keep = {n for n in generic if read[n] == 0}
        ir.keep.update(extra)
    ir.keep.update(p.loss for p in ir.paths if p.loss is not None)
    return ir
