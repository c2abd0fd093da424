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

Folding runs whatever a file says, so it is bounded before anything runs: a node's
outputs are sized first (``Range`` from its start, limit and delta, ``Expand`` and
``Tile`` from their shape and repeats, any other operator by ONNX's shape inference
on its constant inputs), and a folded value of more than ``MAX_FOLD_ELEMENTS``
elements or ``MAX_FOLD_BYTES`` bytes is an error naming the node and the size, as is
an amplifying operator whose output cannot be sized.  Control flow is folded only
where it is bounded: a ``Loop`` or ``If`` whose inputs and outer-scope reads are all
constants, with no nested control flow, runs node by node with each node bounded as
above (:mod:`engine.onnx_io.control`); a ``Loop`` needs a constant trip count of at
most ``MAX_TRIPS``; ``Scan`` and ``SequenceMap`` are never folded.  A
``ConstantOfShape`` (a view, never a copy) is held to the per-tensor cap,
``MAX_TENSOR_ELEMENTS``.

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

import math
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.onnx_io.batch_reshape import batch_reshapes
from engine.onnx_io.control import fold_control, outer_names
from engine.onnx_io.reference import (
    CONTROL,
    RANDOM,
    evaluate_node,
    inferred_model,
    inferred_shapes,
)
from engine.onnx_io.safety import (
    MAX_FOLD_BYTES,
    MAX_FOLD_ELEMENTS,
    MAX_TENSOR_ELEMENTS,
    subgraphs,
)
from engine.ops import OP_TABLE
from engine.ops._onnx import OnnxForm

MAX_TRIPS = 1 << 16  # a folded Loop's iterations (10^12 would never return)
FOLDED_CONTROL = {"Loop", "If"}  # run node by node, bounded (engine.onnx_io.control)
# Operators whose output may be much larger than their inputs: folded only when sized
AMPLIFY = {"Range", "Expand", "Tile", "ConstantOfShape", "Resize", "Upsample", "Pad",
           "OneHot", "EyeLike", "MatMul", "Gemm",
           "Einsum", "Where", "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor",
           "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "BitShift", "Max",
           "Min", "Sum", "Mean", "ConvTranspose", "Col2Im", "CenterCropPad", "Gather",
           "GatherND"}

# Operators whose import reads static shapes (a 1-D Conv, a softmax before opset 13)
NEEDS_SHAPES = {op.onnx.name for op in OP_TABLE.values()
                if isinstance(op.onnx, OnnxForm) and op.onnx.needs_shapes}


def fold_model(model: Any, consts: dict[str, np.ndarray], batch: bool, weights: set[str],
               train_generated: bool, opset: int
               ) -> tuple[dict[str, np.ndarray], list[Any], set[str], dict[str, tuple[int, ...]]]:
    """:func:`fold` over the model's nodes, repeated while it makes progress: a Shape of
    a value whose shape depended on a folded constant (a Pad's pads) is known once the
    constant is, so shapes are inferred again on what is left.  With ``batch``, a
    Reshape whose target is made of the batch size (``x.view(x.size(0), -1)`` exported
    with a dynamic batch) keeps the batch instead (:mod:`engine.onnx_io.batch_reshape`).
    Also returns the last shapes."""
    nodes = list(model.graph.node)
    generated: set[str] = set()
    shapes: dict[str, tuple[int, ...]] = {}
    while True:
        if any(n.op_type in NEEDS_SHAPES for n in nodes):
            shapes = static_shapes(model, nodes, consts, batch)
        consts, kept, more = fold(nodes, consts, shapes, weights, train_generated, opset)
        if batch:  # shapes computed from a batched value's, which fold keeps
            trained = weights | (generated | more if train_generated else set())
            kept, consts = batch_reshapes(model, kept, consts, opset, trained)
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
    out = {k: tuple(v.shape) for k, v in consts.items()}
    for name, dims, _ in inferred_shapes(inferred_model(model, nodes, consts, batch)):
        out[name] = dims
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
            n = math.prod(shape)
            if any(d < 0 for d in shape) or n > MAX_TENSOR_ELEMENTS:
                raise GraphError(f"node {_name(node)!r} (ConstantOfShape): shape {shape} "
                                 f"({n:,} elements) is not a tensor this engine can hold "
                                 f"(at most {MAX_TENSOR_ELEMENTS:,} elements)")
            consts[node.output[0]] = np.broadcast_to(arr.reshape(()), shape)  # no copy
            generated.add(node.output[0])
        elif node.op_type == "Shape" and ins and _shape_known(node, shapes.get(ins[0])):
            consts[node.output[0]] = _shape_of(node, shapes[ins[0]])
        elif node.op_type in CONTROL:
            reads = ins + sorted(outer_names(node))
            if (node.op_type in FOLDED_CONTROL and all(i in consts for i in reads)
                    and not any(i in weights or (train_generated and i in generated)
                                for i in reads)):
                check_bounded(node, consts, opset)
                for name, arr in zip(node.output, fold_control(node, consts, weights, opset, fold),
                                     strict=False):
                    _refuse_size(node, int(arr.size), int(arr.nbytes))
                    consts[name] = arr
            else:
                kept.append(node)
        elif (node.op_type not in RANDOM and ins and all(i in consts for i in ins)
              and not any(i in weights or (train_generated and i in generated)
                          for i in ins)):
            check_bounded(node, consts, opset)
            for name, value in zip(node.output, evaluate_node(node, consts, opset), strict=False):
                arr = np.asarray(value)
                _refuse_size(node, int(arr.size), int(arr.nbytes))  # sized wrong: still out
                consts[name] = arr
        else:
            kept.append(node)
    return consts, kept, generated


def _constant(node: Any) -> np.ndarray:
    """A Constant's value: a dense numeric tensor, a float(s) or an int(s); a sparse or
    string value is a :class:`GraphError` naming the node."""
    from onnx import helper, numpy_helper

    if len(node.attribute) != 1:
        raise GraphError(f"node {_name(node)!r} (Constant): needs exactly one value "
                         f"attribute, has {[a.name for a in node.attribute]}")
    a = node.attribute[0]
    if a.name == "value":
        try:
            arr = numpy_helper.to_array(a.t)
        except Exception as e:  # an element type numpy lacks, data not matching the shape
            raise GraphError(f"node {_name(node)!r} (Constant): its value does not load "
                             f"({type(e).__name__}: {e})") from None
        if arr.dtype.kind not in "fiub":
            raise GraphError(f"node {_name(node)!r} (Constant): a {arr.dtype} value is not "
                             "supported (numbers and booleans only)")
        return arr
    if a.name not in ("value_float", "value_floats", "value_int", "value_ints"):
        raise GraphError(f"node {_name(node)!r} (Constant): a {a.name} value is not "
                         "supported (value, value_float(s) and value_int(s) only)")
    v = helper.get_attribute_value(a)
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


def _name(node: Any) -> str:
    return str(node.name or (node.output[0] if node.output else node.op_type))


def _refuse_size(node: Any, n: int, nbytes: int, what: str = "") -> None:
    if n > MAX_FOLD_ELEMENTS or nbytes > MAX_FOLD_BYTES:
        raise GraphError(f"node {_name(node)!r} ({node.op_type}): folding it would make a "
                         f"constant{what} of {n:,} elements ({nbytes:,} bytes); at most "
                         f"{MAX_FOLD_ELEMENTS:,} elements and {MAX_FOLD_BYTES:,} bytes are "
                         "folded")


def check_bounded(node: Any, consts: dict[str, np.ndarray], opset: int) -> None:
    """A :class:`GraphError` naming the node when evaluating it may not be bounded in
    time or memory: outputs sized (before anything runs) over the caps, a Loop with a
    trip count that is unknown or over ``MAX_TRIPS``, or an amplifying operator whose
    outputs cannot be sized."""
    ins = [i for i in node.input if i]
    if node.op_type in CONTROL:
        _check_control(node, consts)
    sizes = _explicit_sizes(node, [consts[i] for i in ins]) if ins else None
    if sizes is None:
        sizes = _inferred_sizes(node, consts, opset)
    if sizes is None:
        if node.op_type in AMPLIFY and node.op_type not in CONTROL:  # bounded above
            raise GraphError(f"node {_name(node)!r} ({node.op_type}): its output cannot be "
                             "sized before it runs, so it is not folded (the size of a "
                             "folded constant is capped)")
        return
    for n, nbytes in sizes:
        _refuse_size(node, n, nbytes)


def _check_control(node: Any, consts: dict[str, np.ndarray]) -> None:
    nested = sorted({n.op_type for b in subgraphs(node) for n in _all_nodes(b)} & CONTROL)
    if nested:
        raise GraphError(f"node {_name(node)!r} ({node.op_type}): control flow nested in it "
                         f"({', '.join(nested)}) cannot be bounded; it is not folded")
    if node.op_type != "Loop":
        return
    m = node.input[0] if len(node.input) else ""
    if not m:
        raise GraphError(f"node {_name(node)!r} (Loop): no trip count, so its iterations "
                         f"cannot be bounded; a folded Loop needs a constant trip count of "
                         f"at most {MAX_TRIPS:,}")
    trips = consts[m]
    if trips.size != 1 or int(trips.reshape(-1)[0]) > MAX_TRIPS:
        raise GraphError(f"node {_name(node)!r} (Loop): trip count "
                         f"{trips.reshape(-1)[:1].tolist()} is over the {MAX_TRIPS:,} "
                         "iterations a folded Loop may run")


def _all_nodes(graph: Any) -> list[Any]:
    out = []
    for n in graph.node:
        out.append(n)
        for g in subgraphs(n):
            out.extend(_all_nodes(g))
    return out


def _explicit_sizes(node: Any, vals: list[np.ndarray]) -> list[tuple[int, int]] | None:
    """Output sizes of the operators that build a large value from a few numbers, from
    those numbers (None for any other operator)."""
    try:
        if node.op_type == "Range" and len(vals) == 3:
            start, limit, delta = (float(v.reshape(-1)[0]) for v in vals)
            if not all(map(math.isfinite, (start, limit, delta))) or delta == 0:
                raise GraphError(f"node {_name(node)!r} (Range): start {start}, limit "
                                 f"{limit}, delta {delta} make no finite range")
            n = max(math.ceil((limit - start) / delta), 0)
            return [(n, n * vals[0].dtype.itemsize)]
        if node.op_type == "Expand" and len(vals) == 2:
            shape = [int(d) for d in vals[1].reshape(-1)]
            x = list(vals[0].shape)
            rank = max(len(x), len(shape))
            x, shape = [1] * (rank - len(x)) + x, [1] * (rank - len(shape)) + shape
            n = math.prod(max(a, b) for a, b in zip(x, shape, strict=True))
            return [(n, n * vals[0].dtype.itemsize)]
        if node.op_type == "Tile" and len(vals) == 2:
            reps = [int(r) for r in vals[1].reshape(-1)]
            n = vals[0].size * math.prod(max(r, 0) for r in reps)
            return [(n, n * vals[0].dtype.itemsize)]
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None


def _inferred_sizes(node: Any, consts: dict[str, np.ndarray], opset: int
                    ) -> list[tuple[int, int]] | None:
    """Output sizes by ONNX's shape inference on the node, its small constant inputs as
    initializers (their values size Reshape, Expand, Pad...); None where an output's
    shape is not fully known."""
    from onnx import helper, numpy_helper, shape_inference

    ins = [i for i in node.input if i]
    small = [i for i in ins if consts[i].size <= 1 << 16]
    try:
        graph = helper.make_graph(
            [node], "size",
            [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(consts[i].dtype),
                                           consts[i].shape) for i in ins if i not in small],
            [helper.make_tensor_value_info(o, 0, None) for o in node.output if o],
            [numpy_helper.from_array(np.ascontiguousarray(consts[i]), i) for i in small])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        # data propagation follows the values of shape-sized inputs; over a large one it
        # builds a dimension per element (seconds per call at 10^7 elements)
        inferred = shape_inference.infer_shapes(model, data_prop=len(small) == len(ins))
    except Exception:  # inference raises whatever it raises: the size is unknown
        return None
    sizes = []
    for vi in inferred.graph.output:
        t = vi.type.tensor_type
        if not t.HasField("shape") or not all(d.HasField("dim_value") for d in t.shape.dim):
            return None
        n = math.prod(d.dim_value for d in t.shape.dim)
        try:
            item = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except Exception:
            item = 8
        sizes.append((n, n * item))
    return sizes or None
