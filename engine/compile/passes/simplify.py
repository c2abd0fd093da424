"""Algebraic no-ops: ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``, ``Identity``, a
reshape or transpose to the same layout, and two reshapes or two transposes in a row
(merged into one, or into nothing when they cancel).

A value the user reads back (an output, a loss) is never removed.

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3, 4)); p = g.path("f")
>>> t = p.Transpose(p.Transpose(x, perm=(0, 2, 1)), perm=(0, 2, 1))
>>> y = p.Tanh(p.Mul(t, g.constant(1.0)))
>>> [i.op for i in compile_graph(g, batch_size=2).instrs]
['Tanh']
"""

from __future__ import annotations

from collections import Counter

from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.rewrite import constant_scalar, readers, rename, resolve
from engine.ops.shape import transpose_perm

RESHAPES = ("Reshape", "Flatten")
_NEUTRAL = {"Add": (0.0, (0, 1)), "Sub": (0.0, (1,)), "Mul": (1.0, (0, 1)), "Div": (1.0, (1,))}


_PAIRS = frozenset({*RESHAPES, "Transpose"})  # ops that merge with one of their kind
_REWRITTEN = _PAIRS | {"Identity", *_NEUTRAL}  # every op this pass may change


def simplify(ir: IR) -> IR:
    count = readers(ir)
    mapping: dict[str, str] = {}
    for path in ir.paths:
        producer: dict[str, IRNode] = {}  # of the values only a pair's outer op merges
        dead: set[int] = set()
        for node in path.forward:
            if mapping and not mapping.keys().isdisjoint(node.inputs):
                node.inputs = tuple(resolve(mapping, x) for x in node.inputs)
            if node.op not in _REWRITTEN or len(node.outputs) != 1:
                continue
            _merge_pair(ir, node, producer, count, dead)
            if node.outputs[0] not in ir.keep:
                same = _equal_input(ir, node)
                if same is not None:
                    mapping[node.outputs[0]] = same
                    ir.drop(node.outputs[0])
                    dead.add(id(node))
                    continue
            if node.op in _PAIRS:
                producer[node.outputs[0]] = node
        if dead:
            path.forward = [n for n in path.forward if id(n) not in dead]
    rename(ir, mapping)
    return ir


def _equal_input(ir: IR, node: IRNode) -> str | None:
    """The input ``node``'s output always equals (same values, same layout), if any."""
    y = ir.descs[node.outputs[0]]
    if node.op == "Identity" or node.op in RESHAPES:
        return node.inputs[0] if ir.descs[node.inputs[0]] == y else None
    if node.op == "Transpose":
        perm = transpose_perm(node.attrs, len(y.shape))
        return node.inputs[0] if perm == tuple(range(len(perm))) else None
    if node.op in _NEUTRAL:
        value, slots = _NEUTRAL[node.op]
        for k in slots:
            other = node.inputs[1 - k]
            if constant_scalar(ir, node.inputs[k]) == value and ir.descs[other] == y:
                return other
    return None


def _merge_pair(ir: IR, node: IRNode, producer: dict[str, IRNode], count: Counter[str],
                dead: set[int]) -> None:
    """Reshape(Reshape(x)) -> Reshape(x); Transpose(Transpose(x)) -> Transpose(x), when
    the inner result has no other reader."""
    inner = producer.get(node.inputs[0])
    if inner is None or id(inner) in dead or count[node.inputs[0]] != 1 or \
            inner.outputs[0] in ir.keep:
        return
    if node.op in RESHAPES and inner.op in RESHAPES:
        # The output's generic shape is a valid target: a leading 0 copies the batch.
        node.op, node.attrs = "Reshape", {"shape": ir.descs[node.outputs[0]].shape}
    elif node.op == "Transpose" and inner.op == "Transpose":
        rank = len(ir.descs[node.outputs[0]].shape)
        p_in, p_out = transpose_perm(inner.attrs, rank), transpose_perm(node.attrs, rank)
        node.attrs = {"perm": tuple(p_in[a] for a in p_out)}
    else:
        return
    ir.drop(inner.outputs[0])
    dead.add(id(inner))
    node.inputs = (inner.inputs[0],)
