"""Dead-code elimination: drop nodes no output, loss or later node needs, and frozen
parameters nothing reads any more (what constant folding leaves behind).

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); p = g.path("f")
>>> y = p.Tanh(x); unused = p.Exp(x); g.output(y)
>>> [i.op for i in compile_graph(g, batch_size=2).instrs]
['Tanh']
"""

from __future__ import annotations

from engine.compile.passes.ir import IR


def eliminate_dead_code(ir: IR) -> IR:
    live = set(ir.keep)
    live.update(p.loss for p in ir.paths if p.loss is not None)
    # A path reads only what it or an earlier path computes, so one reverse sweep
    # over the paths (and their nodes) sees every reader before its producer.
    for path in reversed(ir.paths):
        kept = []
        for node in reversed(path.forward):
            if not live.isdisjoint(node.outputs):
                kept.append(node)
                live.update(node.inputs)
            else:
                for o in node.outputs:
                    ir.drop(o)
        path.forward = kept[::-1]
    for name in [n for n, p in ir.params.items() if not p.trainable and n not in live]:
        ir.drop(name)
    return ir
