"""Fusion: ``MatMul`` + ``Add`` of a bias into ``Gemm`` (a Linear layer), a Gemm
followed by Relu, Sigmoid or Tanh into ``FusedGemm``, and a per-tensor
``DequantizeLinear`` feeding a Gemm's rows into ``DequantizeGemm``.  Only when the
intermediate has no other reader and is not read back by the user.

>>> from engine import CalcGraph, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); p = g.path("f")
>>> w = g.parameter("w", (3, 2)); b = g.parameter("b", (2,))
>>> y = p.Relu(p.Add(p.MatMul(x, w), b))
>>> [(i.op, i.attrs["activation"]) for i in compile_graph(g, batch_size=2).instrs]
[('FusedGemm', 'Relu')]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from engine.compile.passes.ir import IR, IRNode
from engine.compile.passes.rewrite import readers
from engine.compile.passes.shapes import node_descs
from engine.errors import ShapeError
from engine.ops import get_op
from engine.ops._base import VARIANT_ATTR, VARIANT_SEP
from engine.ops.fused import FUSABLE_ACTIVATIONS, gemm_attrs

# (a node, the producer of one of its inputs) -> the fused node, or None
Rule = Callable[[IR, IRNode, IRNode, str], "IRNode | None"]


def fuse_gemm(ir: IR) -> IR:
    """MatMul(A, B) + C -> Gemm(A, B, C) for 2-D A and B and C broadcasting to the result."""
    return _fuse(ir, ("Add",), "MatMul", _gemm_rule)


def fuse_activation(ir: IR) -> IR:
    """act(Gemm(A, B, C)) -> FusedGemm(A, B, C, activation=act)."""
    return _fuse(ir, FUSABLE_ACTIVATIONS, "Gemm", _activation_rule)


def fuse_dequantize(ir: IR) -> IR:
    """(Fused)Gemm(DequantizeLinear(X), B, C) -> DequantizeGemm(X, B, C): the float copy
    of integer data is never stored (:mod:`engine.ops.dequantize_gemm`)."""
    return _fuse(ir, ("Gemm", "FusedGemm"), "DequantizeLinear", _dequantize_rule)


def _gemm_rule(ir: IR, node: IRNode, inner: IRNode, via: str) -> IRNode | None:
    c = node.inputs[1] if node.inputs[0] == via else node.inputs[0]
    fused = IRNode("Gemm", (*inner.inputs, c), node.outputs, get_op("Gemm").with_defaults({}),
                   node.path, origin=f"{inner.origin} fused with {node.origin}")
    try:
        descs = node_descs(ir, fused)
    except ShapeError:
        return None  # e.g. a batched matrix product: Gemm is 2-D only
    return fused if descs == [ir.descs[o] for o in node.outputs] else None


def _activation_rule(ir: IR, node: IRNode, inner: IRNode, via: str) -> IRNode | None:
    # Same shapes as the Gemm's (the activation is elementwise): nothing to check.
    attrs = {**gemm_attrs(inner.attrs), "activation": node.op}
    if inner.variant_fixed:  # the user's Gemm layout is kept, or the Gemm is not fused
        name = inner.attrs[VARIANT_ATTR]
        if name.split(VARIANT_SEP)[0] not in get_op("FusedGemm").variants:
            return None
        attrs[VARIANT_ATTR] = name
    return IRNode("FusedGemm", inner.inputs, node.outputs, attrs, node.path,
                  origin=f"{inner.origin} fused with {node.origin}",
                  variant_fixed=inner.variant_fixed)


def _dequantize_rule(ir: IR, node: IRNode, inner: IRNode, via: str) -> IRNode | None:
    q, g = inner.attrs, node.attrs
    per_tensor = not isinstance(q["scale"], tuple | list) and \
        not isinstance(q["zero_point"], tuple | list)
    # The blocks are rows of A, so A must be the untransposed first operand (and only
    # that: B or C reading the same value would need the float copy anyway).
    if via != node.inputs[0] or via in node.inputs[1:] or g["transA"] or not per_tensor:
        return None
    attrs = {"transB": g["transB"], "alpha": g["alpha"], "beta": g["beta"],
             "activation": g.get("activation"), "scale": float(q["scale"]),
             "zero_point": int(q["zero_point"])}
    return IRNode("DequantizeGemm", (inner.inputs[0], *node.inputs[1:]), node.outputs,
                  get_op("DequantizeGemm").with_defaults(attrs), node.path,
                  origin=f"{inner.origin} fused with {node.origin}")


def _fuse(ir: IR, outer: tuple[str, ...], inner_op: str, rule: Rule) -> IR:
    ops = {node.op for path in ir.paths for node in path.forward}
    if inner_op not in ops or ops.isdisjoint(outer):
        return ir  # nothing to fuse: no need to count readers
    count: Counter[str] = readers(ir)
    for path in ir.paths:
        producer: dict[str, int] = {}  # outputs of the inner op's nodes -> index in out
        out: list[IRNode | None] = []
        fused = False
        for node in path.forward:
            if node.op in outer:
                was, node = node, _try(ir, node, producer, out, count, inner_op, rule)
                fused |= node is not was
            if node.op == inner_op:
                for o in node.outputs:
                    producer[o] = len(out)
            out.append(node)
        if fused:
            path.forward = [n for n in out if n is not None]
    return ir


def _try(ir: IR, node: IRNode, producer: dict[str, int], out: list[IRNode | None],
         count: Counter[str], inner_op: str, rule: Rule) -> IRNode:
    for via in dict.fromkeys(node.inputs):
        j = producer.get(via, -1)
        inner = out[j] if j >= 0 else None
        if inner is None or inner.op != inner_op or count[via] != 1 or via in ir.keep:
            continue
        fused = rule(ir, node, inner, via)
        if fused is None:
            continue
        out[j] = None
        ir.drop(via)
        return fused
    return node
