"""Common-subexpression elimination: within a path, a pure node with the same op,
inputs and attributes as an earlier one reuses that node's outputs.

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); p = g.path("f")
>>> y = p.Add(p.Exp(x), p.Exp(x))
>>> [i.op for i in compile_graph(g, batch_size=2).instrs]
['Exp', 'Add']
"""

from __future__ import annotations

from typing import Any

from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.rewrite import rename, resolve
from engine.ops import get_op


def eliminate_common_subexpressions(ir: IR) -> IR:
    mapping: dict[str, str] = {}
    for path in ir.paths:
        seen: dict[Any, IRNode] = {}
        kept = []
        for node in path.forward:
            if mapping and not mapping.keys().isdisjoint(node.inputs):
                node.inputs = tuple(resolve(mapping, x) for x in node.inputs)
            key = _key(node) if get_op(node.op).pure else None
            first = seen.get(key) if key is not None else None
            if first is not None and ir.keep.isdisjoint(node.outputs):
                for o, same in zip(node.outputs, first.outputs, strict=True):
                    mapping[o] = same
                    ir.drop(o)
                continue
            if key is not None:
                seen.setdefault(key, node)
            kept.append(node)
        path.forward = kept
    rename(ir, mapping)
    return ir


def _key(node: IRNode) -> Any:
    if not node.attrs:
        return node.op, node.inputs, ()
    try:
        attrs = tuple(sorted(node.attrs.items()))
        hash(attrs)
    except TypeError:
        return None
    return node.op, node.inputs, attrs
