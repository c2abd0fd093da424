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

from engine.errors import GraphError, InputError
from engine.graph import CalcGraph, Kind, Node
from engine.ops import get_op
from engine.ops._onnx import ONNX_DTYPES, OnnxForm, onnx_attrs
from engine.runtime.initializers import initial_values

OPSET = 17


def _trained(vm: Any, name: str, init: Any) -> Any:
    """Parameter ``name``'s value in ``vm``; None for a constant that the compiler
    simplified away (the 0 of ``x - 0``), whose value its init holds."""
    try:
        return vm.get(name)
    except InputError:
        if init.method != "values":
            raise
        return None


def export_onnx(graph: CalcGraph, outputs: Sequence[str] | None = None, vm: Any = None,
                name: str | None = None) -> Any:
    """An ``onnx.ModelProto`` computing ``outputs`` (default: the graph's declared
    outputs) from the placeholders they need."""
    from onnx import TensorProto, helper, numpy_helper

    wanted = list(outputs or graph.outputs)
    if not wanted:
        raise GraphError("export_onnx needs outputs: name them, or declare graph.output(...)")
    nodes = _needed(graph, wanted)
    unsupported = sorted({n.op for n in nodes if _form(n.op) is None})
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
            value = _trained(vm, vname, var.init) if vm is not None else None
            if value is None:
                value = initial_values(var.init, desc.shape, np.dtype(desc.dtype.value), rng)
            inits.append(numpy_helper.from_array(np.asarray(value), vname))
        elif var.kind is Kind.PLACEHOLDER:
            dims = ["N" if i == 0 and desc.batched else d for i, d in enumerate(desc.shape)]
            inputs.append(helper.make_tensor_value_info(vname, ONNX_DTYPES[desc.dtype.value],
                                                        dims))
    for n in nodes:
        form = _form(n.op)
        assert form is not None
        if form.export and form.needs_shapes:  # the exporter reads its inputs' shapes
            n = Node(n.op, n.inputs, n.outputs,
                     {**n.attrs, "input_shapes": tuple(ir.descs[x].shape for x in n.inputs)})
        made, extra = form.export(n, helper, numpy_helper) if form.export else (
            [helper.make_node(form.name, list(n.inputs), list(n.outputs),
                              **onnx_attrs(n.attrs, form.engine_attrs))], [])
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


def _form(op: str) -> OnnxForm | None:
    """The op's ONNX form where it has one that can be written (OpDef.onnx)."""
    form = get_op(op).onnx
    return form if isinstance(form, OnnxForm) and form.exports else None


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
