"""Pass 2: shape inference, an abstract interpretation of the op table's shape rules
over generic descriptors (a leading 0 is the batch size, left symbolic).

Also the ``typecheck`` verifier: it re-derives every node's output descriptors and
fails, naming the pass that ran last, when one disagrees with what the IR holds.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from engine.compile.passes.ir import IR, IRNode
from engine.errors import ShapeError
from engine.graph import BATCH, TensorDesc
from engine.ops import OpDef, get_op


def _fmt(ir: IR, names: tuple[str, ...]) -> str:
    return ", ".join(f"{n}{_shape_str(ir.descs[n])}" for n in names)


def _shape_str(d: TensorDesc) -> str:
    return str(d)[len(d.dtype.value):] + f" {d.dtype.value}"


_SCALARS = frozenset({int, float, bool, str, type(None)})


def rule_key(op: str, descs: list[TensorDesc] | list[TensorDesc | None],
             attrs: dict[str, Any], *extra: Hashable) -> tuple[Any, ...] | None:
    """What a pure rule of the op table (shape, workspace, gradient) is a function of,
    as a dict key: ``op``, ``extra``, the descriptors by identity (None: a value that is
    not there) and the attributes with their types (``1``, ``1.0`` and ``True`` are
    equal in Python, and a rule may accept one and reject another).  None where an
    attribute is not a plain scalar (a tuple could hold ``1`` or ``1.0``; a list is
    unhashable): such nodes are not memoised.

    By identity: whoever keeps the key keeps the descriptors alive too, so no other
    object can take their ids; :meth:`IR.intern` makes equal descriptors one object.
    A generated 10,000-node training graph has a handful of distinct keys among its
    30,000 nodes, so each rule runs a handful of times.

    >>> from engine.graph import DType
    >>> d = TensorDesc(DType.FLOAT32, (0, 4))
    >>> rule_key("Gemm", [d], {"alpha": 1}) == rule_key("Gemm", [d], {"alpha": 1.0})
    False
    >>> rule_key("Reshape", [d], {"shape": (0, 2, 2)}) is None
    True
    """
    key: list[Any] = [op, *extra, len(descs), *map(id, descs)]
    for name, value in attrs.items():
        kind = type(value)
        if kind not in _SCALARS:
            return None
        key += (name, value, kind)
    return tuple(key)


def node_descs(ir: IR, node: IRNode, op: OpDef | None = None) -> list[TensorDesc]:
    """Output descriptors of ``node`` by its op's shape rule, with errors in context.
    ``op``: the node's op definition, where the caller has it already.  A rule is a
    pure function of its arguments, so its result is kept in ``ir.shape_memo`` and
    reused for nodes with equal ones; the outputs are interned (:meth:`IR.intern`)."""
    ins = list(map(ir.descs.__getitem__, node.inputs))
    key = rule_key(node.op, ins, node.attrs, len(node.outputs), node.backward)
    if key is not None:
        known = ir.shape_memo.get(key)
        if known is not None:
            return list(known[1])
    if op is None:
        op = get_op(node.op)
    try:
        outs = op.shape(ins, node.attrs)
    except ShapeError as e:
        raise type(e)(f"{node.origin or node.op}: {e} (inputs: {_fmt(ir, node.inputs)})") \
            from None  # the same class: ZeroSizeError stays one
    if op.variadic_outputs and not node.backward:  # optional outputs: the ones named (a
        outs = outs[:len(node.outputs)]  # gradient builder names all there are)
    for o, d in zip(node.outputs, outs, strict=False):
        shape = d.shape
        if shape and (min(shape) < 0 or BATCH in shape[1:]):
            raise ShapeError(f"{node.origin or node.op}: output {o!r} would have shape "
                             f"{shape}; the batch dimension must stay leading")
    outs = [ir.intern(d) for d in outs]
    if key is not None:
        ir.shape_memo[key] = (tuple(ins), tuple(outs))
    return outs


def infer_shapes(ir: IR) -> IR:
    descs = ir.descs
    for path in ir.paths:
        for node in path.forward:
            outs = node_descs(ir, node)
            if len(outs) == 1 == len(node.outputs):
                descs[node.outputs[0]] = outs[0]
            else:
                for o, d in zip(node.outputs, outs, strict=True):
                    descs[o] = d
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
