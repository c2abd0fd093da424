"""Shapes computed from a batched value's shape, as PyTorch exports them with a dynamic
batch: ``x.view(x.size(0), -1)`` is ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``,
nanoGPT's ``bias[:, :, :T, :T]`` a Slice whose ends come from ``Shape(x)[1]``.  The batch
size is not known at import, so ``engine.onnx_io.fold`` keeps such a Shape, and
this engine's Reshape and Slice take those inputs as attributes.

:func:`batch_reshapes` evaluates the inputs computed from such Shapes with the batch as
a marker, :data:`MARK`.  The marker may only be *moved* (``Gather``, ``Unsqueeze``,
``Squeeze``, ``Concat``, ``Slice``, ``Identity``, in their data, never in their indices
or axes), so it comes out exactly where the batch size is; any other operator (``Div``
of a dimension by the heads) runs only on values the marker is not in.  An input
without the marker is the constant it is.  A Reshape's target with the batch size as
its first dimension, of a tensor whose first dimension is the batch, is that target
with ``0`` there (ONNX: copy that dimension; not with ``allowzero``).  Any other use of
the batch size (arithmetic on it, the batch elsewhere in a target) is left as it was,
and the import says that the input must be a constant.  The nodes that only those
inputs read go; the caller's model is not changed.

>>> from onnx import TensorProto, helper
>>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 3])
>>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 6])
>>> nodes = [helper.make_node("Shape", ["x"], ["s"]),
...          helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
...          helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
...          helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
...          helper.make_node("Reshape", ["x", "target"], ["y"])]
>>> model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
>>> consts = {"zero": np.array(0), "axes": np.array([0]), "rest": np.array([-1])}
>>> kept, consts = batch_reshapes(model, nodes, consts, opset=18)
>>> [n.op_type for n in kept], consts[kept[0].input[1]].tolist()
(['Reshape'], [0, -1])
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.onnx_io.control import outer_names
from engine.onnx_io.reference import (
    CONTROL,
    RANDOM,
    evaluate_node,
    inferred_model,
    inferred_shapes,
)

MARK = np.int64(-(2**62) - 7)  # the batch size, in a shape: never a real dimension
SMALL = 64  # elements of a value in a shape's computation: shape vectors, not tensors
DEPTH = 24  # operators from a shape to where it is used: a few, in exported models
# Operators that only move a shape's elements, and the inputs whose elements they move
# (the others, indices and axes, must be plain constants).  Any other operator may
# compute only on values the batch size is not in (``C // heads`` from a Shape).
MOVES = {"Gather": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Concat": None, "Slice": (0,),
         "Identity": (0,)}


def batch_reshapes(model: Any, nodes: list[Any], consts: dict[str, np.ndarray], opset: int,
                   weights: AbstractSet[str] = frozenset()
                   ) -> tuple[list[Any], dict[str, np.ndarray]]:
    """``nodes`` with each input computed from a batched value's shape made the constant
    it is: where the batch size is not in it (``T`` of ``x.size(1)``), its value; a
    Reshape's target with the batch size first, ``0`` there; and the nodes only those
    inputs read removed.  ``weights`` (trained) are never read as constants."""
    if not any(n.op_type == "Shape" for n in nodes):
        return nodes, consts
    producer = {o: n for n in nodes for o in n.output if o}
    dims = _batched_dims(model, nodes, consts)
    walk = _Walk(producer, consts, dims, weights, opset)
    consts, out = dict(consts), list(nodes)
    read_before = _read(model, nodes)
    for k, node in enumerate(nodes):
        for i, src in enumerate(node.input):
            if not src or src in consts or src not in producer:
                continue
            value = walk.value(src)
            if value is None:
                continue
            if (value == MARK).any():
                if not _batch_first(node, i, value, dims):
                    continue  # the batch size elsewhere: left to the import's refusal
                value = np.concatenate([[0], value[1:]]).astype(np.int64)
            name = f"{src}:{'batch_reshape' if node.op_type == 'Reshape' else 'static'}"
            consts[name] = value
            if out[k] is node:  # the caller's model is never changed: a copy is
                out[k] = type(node)()
                out[k].CopyFrom(node)
            out[k].input[i] = name
    if all(a is b for a, b in zip(out, nodes, strict=True)):
        return nodes, consts
    return _without_dead(model, out, read_before), consts


def _batch_first(node: Any, i: int, value: np.ndarray, dims: dict[str, tuple[int, ...]]
                 ) -> bool:
    """Whether ``value`` is a Reshape's target with the batch size first and nowhere
    else, reshaping a batched tensor (``allowzero`` unset: its 0 then copies)."""
    from onnx import helper

    if node.op_type != "Reshape" or i != 1 or value.ndim != 1 or node.input[0] not in dims:
        return False
    if any(a.name == "allowzero" and helper.get_attribute_value(a) for a in node.attribute):
        return False
    return bool(value[0] == MARK and not (value[1:] == MARK).any())


class _Walk:
    """Values of a shape's computation, the batch size as :data:`MARK` (memoised; None
    where a value is not such a computation)."""

    def __init__(self, producer: dict[str, Any], consts: dict[str, np.ndarray],
                 dims: dict[str, tuple[int, ...]], weights: AbstractSet[str], opset: int
                 ) -> None:
        self.producer, self.consts, self.dims = producer, consts, dims
        self.weights, self.opset = weights, opset
        self.memo: dict[str, np.ndarray | None] = {}

    def value(self, name: str, depth: int = 0) -> np.ndarray | None:
        if name in self.weights:
            return None
        if name in self.consts:
            v = self.consts[name]
            return v if v.size <= SMALL else None
        if name not in self.memo:
            self.memo[name] = None if depth > DEPTH else self._compute(name, depth)
        return self.memo[name]

    def _compute(self, name: str, depth: int) -> np.ndarray | None:
        node = self.producer.get(name)
        if node is None or len(node.output) != 1 or node.op_type in RANDOM or \
                node.op_type in CONTROL:
            return None
        if node.op_type == "Shape":
            return _shape_with_mark(node, self.dims)
        moved = MOVES.get(node.op_type, ())
        ins: dict[str, np.ndarray] = {}
        for i, src in enumerate(node.input):
            if not src:
                continue
            v = self.value(src, depth + 1)
            if v is None or (moved is not None and i not in moved and (v == MARK).any()):
                return None  # the batch size computed with, or an index: not a move
            ins[src] = v
        try:
            out = np.asarray(evaluate_node(node, ins, self.opset)[0])
        except GraphError:  # not this pass's to say: the import says what is wrong
            return None
        return out if out.size <= SMALL else None


def _batched_dims(model: Any, nodes: list[Any], consts: dict[str, np.ndarray]
                  ) -> dict[str, tuple[int, ...]]:
    """The values whose first dimension is the batch (as ONNX's shape inference carries
    the data inputs' symbolic first dimension), with their dimensions (0: unknown)."""
    return {name: dims for name, dims, batched in
            inferred_shapes(inferred_model(model, nodes, consts, batch=True)) if batched}


def _shape_with_mark(node: Any, dims: dict[str, tuple[int, ...]]) -> np.ndarray | None:
    """A Shape of a batched value whose other dimensions are known: those dimensions,
    the batch as :data:`MARK` (None otherwise)."""
    from onnx import helper

    shape = dims.get(node.input[0])
    if shape is None or any(d <= 0 for d in shape[1:]):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    full = np.asarray([MARK, *shape[1:]], dtype=np.int64)
    return full[int(attrs.get("start", 0)):int(attrs.get("end", len(full)))]


def _read(model: Any, nodes: list[Any]) -> set[str]:
    """The values something reads: the graph's outputs, the nodes' inputs and what
    control flow's bodies read from around them."""
    read = {o.name for o in model.graph.output}
    for n in nodes:
        read |= {i for i in n.input if i}
        if n.op_type in CONTROL:
            read |= outer_names(n)
    return read


def _without_dead(model: Any, nodes: list[Any], read_before: set[str]) -> list[Any]:
    """``nodes`` without those that nothing reads any more and something read before
    (what the rewritten inputs read), repeated while any goes; a node nothing read
    before (a loss that is no graph output, say) stays."""
    while True:
        read = _read(model, nodes)
        kept = [n for n in nodes if any(o in read or o not in read_before
                                        for o in n.output if o)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept
