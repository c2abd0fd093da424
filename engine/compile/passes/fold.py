"""Constant folding: a pure node whose inputs are all constants is run once, at
compile time, and its outputs become constants.

Folded values are stored in the program (as an initialiser), so only results of
at most ``FOLD_LIMIT`` elements are folded; a uniform result is stored as one value.

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); p = g.path("f")
>>> two = p.Add(g.constant(1.0), g.constant(1.0))
>>> y = p.Mul(x, two)
>>> [i.op for i in compile_graph(g, batch_size=2).instrs]
['Mul']
"""

from __future__ import annotations

import numpy as np

from engine.compile.passes.ir import IR, IRParam
from engine.compile.passes.rewrite import constant_array, is_constant
from engine.graph import Init
from engine.ops import KernelArgs, get_op

FOLD_LIMIT = 1 << 16


def fold_constants(ir: IR) -> IR:
    for path in ir.paths:
        kept = []
        for node in path.forward:
            if _foldable(ir, node.op, node.inputs, node.outputs):
                _fold(ir, node.op, node.inputs, node.outputs, node.attrs)
            else:
                kept.append(node)
        path.forward = kept
    return ir


def _foldable(ir: IR, op: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> bool:
    if not all(map(ir.params.__contains__, inputs)):  # quick: constants are parameters
        return False
    if not get_op(op).pure or not all(is_constant(ir, x) for x in inputs):
        return False
    descs = [ir.descs[o] for o in outputs]
    return all(not d.batched and d.numel() <= FOLD_LIMIT for d in descs)


def _fold(ir: IR, op: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
          attrs: dict) -> None:
    opdef = get_op(op)
    ins = [constant_array(ir, x) for x in inputs]
    in_descs = [ir.descs[x] for x in inputs]
    out_descs = [ir.descs[o] for o in outputs]
    outs = [np.empty(d.shape, d.dtype.value) for d in out_descs]
    ws = np.zeros(opdef.workspace(in_descs, out_descs, attrs, "cpu"), np.uint8)
    opdef.kernel(KernelArgs(np, ins, outs, ws, dict(attrs)))()
    for name, value in zip(outputs, outs, strict=True):
        flat = value.ravel()
        uniform = flat.size > 0 and bool((flat == flat[0]).all())
        init = Init.from_values([flat[0].item()] if uniform else flat.tolist())
        ir.params[name] = IRParam(name, init, None, False)
        ir.kind[name] = "param"
