"""Constant subgraphs of an ONNX model, evaluated at import.

Models compute shapes at run time — ``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape``
— and this engine's Reshape, Slice, Pad and Split take those as attributes.  Where the
shapes are static (every dimension but a batch dimension the computation does not
read), such chains are constants: :func:`fold` evaluates them with ONNX's reference
implementation, whatever their operators, so the imported graph keeps only the ops
that touch data.  ``ConstantOfShape`` becomes a broadcast view (no copy: it generates
whole weight tensors in some models).

A node is folded when every input is a constant, it draws no random numbers, and none
of its inputs is a weight that will be trained (folding ``Transpose(W)`` would freeze
``W``).  ``Shape`` is folded when the dimensions it reads are known.

>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])
>>> nodes = [helper.make_node("Shape", ["x"], ["s"], start=1),
...          helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1)]
>>> consts, kept, _ = fold(nodes, {}, {"x": (0, 4, 6)}, set(), False, opset=18)
>>> consts["n"].tolist(), kept
([24], [])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.ops import OP_TABLE
from engine.ops._onnx import OnnxForm
from engine.ops.constant import MAX_ELEMENTS

# Operators whose import reads static shapes (a 1-D Conv, a softmax before opset 13)
NEEDS_SHAPES = {op.onnx.name for op in OP_TABLE.values()
                if isinstance(op.onnx, OnnxForm) and op.onnx.needs_shapes}
# ONNX's operators that draw (most of which this engine lacks): never folded
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
          "Bernoulli", "Multinomial", "Dropout"}


def fold_model(model: Any, consts: dict[str, np.ndarray], batch: bool, weights: set[str],
               train_generated: bool, opset: int
               ) -> tuple[dict[str, np.ndarray], list[Any], set[str], dict[str, tuple[int, ...]]]:
    """:func:`fold` over the model's nodes, repeated while it makes progress: a Shape of
    a value whose shape depended on a folded constant (a Pad's pads) is known once the
    constant is, so shapes are inferred again on what is left.  Also returns the last
    shapes."""
    nodes = list(model.graph.node)
    generated: set[str] = set()
    shapes: dict[str, tuple[int, ...]] = {}
    while True:
        if any(n.op_type in NEEDS_SHAPES for n in nodes):
            shapes = static_shapes(model, nodes, consts, batch)
        consts, kept, more = fold(nodes, consts, shapes, weights, train_generated, opset)
        generated |= more
        done = len(kept) == len(nodes) or not any(n.op_type == "Shape" for n in kept)
        nodes = kept
        if done:
            return consts, nodes, generated, shapes


def static_shapes(model: Any, nodes: list[Any], consts: dict[str, np.ndarray], batch: bool
                  ) -> dict[str, tuple[int, ...]]:
    """Every value's shape by ONNX's shape inference over ``nodes`` with ``consts`` as
    initializers (its data propagation follows shape computations), 0 for an unknown
    dimension.  With ``batch`` the data inputs' first dimension is made symbolic first,
    so that nothing that depends on the batch size passes for a constant."""
    from onnx import helper, numpy_helper, shape_inference

    read = {i for n in nodes for i in n.input if i}
    g = model.graph
    small = {k for k in read if k in consts and consts[k].size <= 1 << 16}
    # Shape-sized constants as initializers (their values propagate); weights only as
    # typed inputs: their shapes are all the inference needs.
    big = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(consts[k].dtype),
                                         consts[k].shape)
           for k in sorted(read - small) if k in consts]
    data = [vi for vi in g.input if vi.name not in consts]
    graph = helper.make_graph(
        nodes, g.name, data + big, list(g.output),
        [numpy_helper.from_array(np.ascontiguousarray(consts[k]), k) for k in sorted(small)],
        value_info=list(g.value_info))
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = max(model.ir_version, 4)
    if batch:
        for vi in m.graph.input[:len(data)]:
            dims = vi.type.tensor_type.shape.dim
            if len(dims):
                dims[0].dim_param = "batch"
    inferred = shape_inference.infer_shapes(m, data_prop=True)
    out = {k: tuple(v.shape) for k, v in consts.items()}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else 0
                                 for d in t.shape.dim)
    return out


def fold(nodes: list[Any], consts: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
         weights: set[str], train_generated: bool, opset: int
         ) -> tuple[dict[str, np.ndarray], list[Any], set[str]]:
    """(constants, including the folded values; the nodes left; the outputs of
    ``ConstantOfShape``, which generate weights).  ``shapes`` has every known static
    shape (0 for an unknown dimension); ``weights`` the inputs not to fold through, and
    with ``train_generated`` the generated weights neither."""
    from onnx import numpy_helper

    consts = dict(consts)
    kept: list[Any] = []
    generated: set[str] = set()
    for node in nodes:
        ins = [i for i in node.input if i]
        if node.op_type == "Constant":
            consts[node.output[0]] = _constant(node)
        elif node.op_type == "ConstantOfShape" and all(i in consts for i in ins):
            shape = tuple(int(v) for v in consts[ins[0]]) if ins else ()
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            arr = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value)
            n = int(np.prod(shape, dtype=np.float64))
            if any(d < 0 for d in shape) or n > MAX_ELEMENTS:
                raise GraphError(f"node {node.name or node.output[0]!r} (ConstantOfShape): "
                                 f"shape {shape} is not a tensor this engine can hold")
            consts[node.output[0]] = np.broadcast_to(arr.reshape(()), shape)  # no copy
            generated.add(node.output[0])
        elif node.op_type == "Shape" and ins and _shape_known(node, shapes.get(ins[0])):
            consts[node.output[0]] = _shape_of(node, shapes[ins[0]])
        elif (node.op_type not in RANDOM and ins and all(i in consts for i in ins)
              and not any(i in weights or (train_generated and i in generated)
                          for i in ins)):
            for name, value in zip(node.output, _evaluate(node, consts, opset), strict=False):
                consts[name] = np.asarray(value)
        else:
            kept.append(node)
    return consts, kept, generated


def _constant(node: Any) -> np.ndarray:
    from onnx import helper, numpy_helper

    a = node.attribute[0]
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    v = helper.get_attribute_value(a)  # value_float(s), value_int(s)
    return np.asarray(v, dtype=np.float32 if "float" in a.name else np.int64)


def _range(rank: int, node: Any) -> tuple[int, int]:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = int(attrs.get("start", 0)), int(attrs.get("end", rank))
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return min(max(start, 0), rank), min(max(end, 0), rank)


def _shape_known(node: Any, shape: tuple[int, ...] | None) -> bool:
    if shape is None:
        return False
    s, e = _range(len(shape), node)
    return all(d > 0 for d in shape[s:e])


def _shape_of(node: Any, shape: tuple[int, ...]) -> np.ndarray:
    s, e = _range(len(shape), node)
    return np.asarray(shape[s:e], dtype=np.int64)


def _evaluate(node: Any, consts: dict[str, np.ndarray], opset: int) -> list[Any]:
    """Run one node with ONNX's reference implementation at the model's opset (a bare
    node would run at the newest one, whose attributes may differ)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [i for i in node.input if i]
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(consts[i].dtype),
                                       consts[i].shape) for i in ins],
        [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        return list(ReferenceEvaluator(model).run(None, {i: consts[i] for i in ins}))
    except Exception as e:  # the reference raises whatever its kernels raise
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}): its "
                         f"constant inputs do not evaluate: {type(e).__name__}: {e}") from None
