"""Export the forward computation of a CalcGraph to ONNX, with trained weights.

The nodes that the requested outputs need are taken from the forward programs of the
graph's paths, in order (a path may read another's results), and written as ONNX
nodes of opset 17.  Parameters become initializers — the values a VM holds when one
is given, else their initial values — and placeholders become inputs whose leading
batch dimension is the symbolic ``N``.  Dropout is exported as the identity it is at
inference.  Ops with no ONNX counterpart (metrics such as Accuracy) are all listed in
one error.

>>> import numpy as np
>>> from engine.models import paper_mlp
>>> model = export_onnx(paper_mlp((4, 3, 2), train=False), outputs=["probs"])
>>> [n.op_type for n in model.graph.node]
['Gemm', 'Sigmoid', 'Gemm', 'Softmax']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.graph import CalcGraph, Kind, Node
from engine.runtime.initializers import initial_values

OPSET = 17
# Ops whose ONNX form is the same node with the same attributes.
SAME = {"Neg", "Abs", "Exp", "Log", "Sqrt", "Sin", "Cos", "Sign", "Identity", "Tanh", "Relu",
        "Sigmoid", "LeakyRelu", "Elu", "Add", "Sub", "Mul", "Div", "MatMul", "Gemm",
        "Softmax", "LogSoftmax", "Flatten", "Transpose", "Conv", "MaxPool", "AveragePool",
        "GlobalAveragePool", "ReduceMean", "SoftmaxCrossEntropyLoss", "Max", "Min", "Concat",
        "Floor", "Ceil", "Reciprocal", "Softplus", "Softsign", "HardSigmoid", "Where", "ArgMax",
        "BatchNormalization", "LayerNormalization", "Sum", "LRN", "ReduceMax", "ReduceMin",
        "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
        "ReduceSumSquare", "Pow", "Gather", "Shape", "NegativeLogLikelihoodLoss",
        "Hardmax", "ConvTranspose"}
ENGINE_ONLY = {"running_update", "algorithm"}  # attributes ONNX does not have
ONNX_DTYPES = {"float32": 1, "float64": 11, "int64": 7, "int32": 6, "int8": 3, "uint8": 2,
               "bool": 9}


def export_onnx(graph: CalcGraph, outputs: Sequence[str] | None = None, vm: Any = None,
                name: str | None = None) -> Any:
    """An ``onnx.ModelProto`` computing ``outputs`` (default: the graph's declared
    outputs) from the placeholders they need."""
    from onnx import TensorProto, helper, numpy_helper

    wanted = list(outputs or graph.outputs)
    if not wanted:
        raise GraphError("export_onnx needs outputs: name them, or declare graph.output(...)")
    nodes = _needed(graph, wanted)
    unsupported = sorted({n.op for n in nodes if n.op not in SAME and n.op not in SPECIAL})
    if unsupported:
        raise GraphError(f"no ONNX form for: {', '.join(unsupported)} (needed for "
                         f"{', '.join(wanted)})")
    from engine.compile.compiler import lower

    ir = lower(graph, passes=())  # the descriptors of every value
    reads = {x for n in nodes for x in n.inputs}
    onnx_nodes, inits, inputs = [], [], []
    rng = np.random.default_rng(0)
    for vname, var in graph.variables.items():
        if vname not in reads:
            continue
        desc = ir.descs[vname]
        if var.kind is Kind.PARAMETER:
            assert var.init is not None
            value = vm.get(vname) if vm is not None else initial_values(
                var.init, desc.shape, np.dtype(desc.dtype.value), rng)
            inits.append(numpy_helper.from_array(np.asarray(value), vname))
        elif var.kind is Kind.PLACEHOLDER:
            dims = ["N" if i == 0 and desc.batched else d for i, d in enumerate(desc.shape)]
            inputs.append(helper.make_tensor_value_info(vname, ONNX_DTYPES[desc.dtype.value],
                                                        dims))
    for n in nodes:
        attrs = dict(n.attrs)
        # noop_with_empty_axes is an opset-18 attribute of ReduceMean; 0 is what it did
        if n.op == "ReduceMean" and attrs.pop("noop_with_empty_axes", 0):
            raise GraphError(f"{n.op} with noop_with_empty_axes=1 has no opset-{OPSET} form")
        made, extra = SPECIAL[n.op](n, helper, numpy_helper) if n.op in SPECIAL else (
            [helper.make_node(n.op, list(n.inputs), list(n.outputs), **_attrs(attrs))], [])
        onnx_nodes.extend(made)
        inits.extend(extra)
    outs = []
    for o in wanted:
        desc = ir.descs[o]
        dims = ["N" if i == 0 and desc.batched else d for i, d in enumerate(desc.shape)]
        outs.append(helper.make_tensor_value_info(o, ONNX_DTYPES.get(desc.dtype.value,
                                                                     TensorProto.FLOAT), dims))
    g = helper.make_graph(onnx_nodes, name or graph.name, inputs, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="calcgraph-explore")
    model.ir_version = 8
    return model


def _needed(graph: CalcGraph, wanted: list[str]) -> list[Node]:
    order = [n for p in graph.paths for n in p.nodes]
    need = set(wanted)
    kept: list[Node] = []
    for n in reversed(order):
        if any(o in need for o in n.outputs):
            kept.append(n)
            need.update(n.inputs)
    missing = [o for o in wanted if o not in graph.variables]
    if missing:
        raise GraphError(f"export_onnx: no variable(s) {missing} in graph {graph.name!r}")
    return kept[::-1]


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in attrs.items():
        if k in ENGINE_ONLY:
            continue
        if v is None or (isinstance(v, tuple | list) and len(v) == 0):
            continue  # ONNX's own default
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _reshape(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    shape = nh.from_array(np.asarray(n.attrs["shape"], dtype=np.int64), f"{n.outputs[0]}:shape")
    return [helper.make_node("Reshape", [n.inputs[0], shape.name], [n.outputs[0]])], [shape]


def _reduce_sum(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    attrs = dict(n.attrs)
    axes = attrs.pop("axes", None)
    extra = []
    ins = [n.inputs[0]]
    if axes:
        t = nh.from_array(np.asarray(axes, dtype=np.int64), f"{n.outputs[0]}:axes")
        extra.append(t)
        ins.append(t.name)
    return [helper.make_node("ReduceSum", ins, list(n.outputs), **_attrs(attrs))], extra


def _dropout(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    return [helper.make_node("Identity", [n.inputs[0]], [n.outputs[0]])], []


def _square(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    return [helper.make_node("Mul", [n.inputs[0], n.inputs[0]], list(n.outputs))], []


def _axes_input(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    """Squeeze and Unsqueeze take their axes as an input from opset 13."""
    axes = nh.from_array(np.asarray(n.attrs["axes"], dtype=np.int64), f"{n.outputs[0]}:axes")
    return [helper.make_node(n.op, [n.inputs[0], axes.name], list(n.outputs))], [axes]


def _split(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    axis = int(n.attrs.get("axis", 0))
    if n.attrs.get("split"):
        t = nh.from_array(np.asarray(n.attrs["split"], dtype=np.int64), f"{n.outputs[0]}:split")
        return [helper.make_node("Split", [n.inputs[0], t.name], list(n.outputs),
                                 axis=axis)], [t]
    return [helper.make_node("Split", [n.inputs[0]], list(n.outputs), axis=axis)], []


def _cast(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    from engine.ops.cast import target_dtype

    to = ONNX_DTYPES[target_dtype(n.attrs["to"]).value]
    return [helper.make_node("Cast", [n.inputs[0]], list(n.outputs), to=to)], []


def _dequantize(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    scale = nh.from_array(np.asarray(n.attrs["scale"], dtype=np.float32), f"{n.outputs[0]}:scale")
    extra = [scale]
    ins = [n.inputs[0], scale.name]
    if n.attrs.get("zero_point"):
        zp = nh.from_array(np.asarray(n.attrs["zero_point"], dtype=n.attrs.get("zero_dtype")
                                      or "uint8"), f"{n.outputs[0]}:zero_point")
        extra.append(zp)
        ins.append(zp.name)
    return [helper.make_node("DequantizeLinear", ins, list(n.outputs))], extra


def _inputs_from_attrs(n: Node, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    """Slice, Pad and Clip take these attributes as (optional) inputs in ONNX."""
    keys = {"Slice": ("starts", "ends", "axes", "steps"), "Pad": ("pads", "value", "axes"),
            "Clip": ("min", "max")}
    ins, extra = [n.inputs[0]], []
    for key in keys[n.op]:
        v = n.attrs.get(key)
        if v is None or (isinstance(v, tuple) and not v):
            ins.append("")
            continue
        dtype = np.float32 if key in ("value", "min", "max") else np.int64
        t = nh.from_array(np.asarray(v, dtype=dtype), f"{n.outputs[0]}:{key}")
        extra.append(t)
        ins.append(t.name)
    while ins[-1] == "":
        ins.pop()
    attrs = {"mode": n.attrs["mode"]} if n.op == "Pad" else {}
    return [helper.make_node(n.op, ins, list(n.outputs), **attrs)], extra


SPECIAL = {"Slice": _inputs_from_attrs, "Pad": _inputs_from_attrs, "Cast": _cast,
           "DequantizeLinear": _dequantize, "Split": _split, "Reshape": _reshape,
           "ReduceSum": _reduce_sum, "Dropout": _dropout,
           "Square": _square, "Squeeze": _axes_input, "Unsqueeze": _axes_input,
           "Clip": _inputs_from_attrs}
