"""Pass 2: shape inference, an abstract interpretation of the op table's shape rules
over generic descriptors (a leading 0 is the batch size, left symbolic).

Also the ``typecheck`` verifier: it re-derives every node's output descriptors and
fails, naming the pass that ran last, when one disagrees with what the IR holds.
"""

from __future__ import annotations

from engine.compile.passes.ir import IR, IRNode
from engine.errors import ShapeError
from engine.graph import BATCH, TensorDesc
from engine.ops import get_op


def _fmt(ir: IR, names: tuple[str, ...]) -> str:
    return ", ".join(f"{n}{_shape_str(ir.descs[n])}" for n in names)


def _shape_str(d: TensorDesc) -> str:
    return str(d)[len(d.dtype.value):] + f" {d.dtype.value}"


def node_descs(ir: IR, node: IRNode) -> list[TensorDesc]:
    """Output descriptors of ``node`` by its op's shape rule, with errors in context."""
    op = get_op(node.op)
    ins = [ir.descs[x] for x in node.inputs]
    try:
        outs = op.shape(ins, node.attrs)
    except ShapeError as e:
        raise type(e)(f"{node.origin or node.op}: {e} (inputs: {_fmt(ir, node.inputs)})") \
            from None  # the same class: ZeroSizeError stays one
    if op.variadic_outputs and not node.backward:  # optional outputs: the ones named (a
        outs = outs[:len(node.outputs)]  # gradient builder names all there are)
    for o, d in zip(node.outputs, outs, strict=False):
        if BATCH in d.shape[1:] or (d.shape and min(d.shape) < 0):
            raise ShapeError(f"{node.origin or node.op}: output {o!r} would have shape "
                             f"{d.shape}; the batch dimension must stay leading")
    return outs


def infer_shapes(ir: IR) -> IR:
    for path in ir.paths:
        for node in path.forward:
            for o, d in zip(node.outputs, node_descs(ir, node), strict=True):
                ir.descs[o] = d
    return ir


def typecheck(ir: IR, after: str) -> None:
    """Verify the IR: every value read is defined earlier (a placeholder, a parameter,
    or the output of an earlier node of this or an earlier path), produced once, and
    every node's outputs match its shape rule.  Fails naming the pass that ran last."""
    where = f"typecheck after pass {after!r}"
    defined = {n for n, k in ir.kind.items() if k in ("param", "placeholder", "seed")}
    for path in ir.paths:
        for node in [*path.forward, *path.backward]:
            for name in node.inputs:
                if name not in ir.descs:
                    raise ShapeError(f"{where}: {node.origin or node.op} reads {name!r}, "
                                     "which has no descriptor")
                if name not in defined:
                    raise ShapeError(f"{where}: {node.origin or node.op} reads {name!r} "
                                     "before any node computes it")
            for o, d in zip(node.outputs, node_descs(ir, node), strict=True):
                if o in defined and ir.kind.get(o) != "grad":  # grads: one sink per path
                    raise ShapeError(f"{where}: {node.origin or node.op} computes {o!r}, "
                                     "which is already defined")
                if ir.descs.get(o) != d:
                    raise ShapeError(f"{where}: {node.origin or node.op} output {o!r} is "
                                     f"{ir.descs.get(o)}, its rule says {d}")
                defined.add(o)
        if path.loss is not None and path.loss not in defined:
            raise ShapeError(f"{where}: the loss {path.loss!r} of path {path.name!r} is "
                             "not computed")
