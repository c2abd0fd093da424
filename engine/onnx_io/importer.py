"""Import an ONNX model as a CalcGraph.

Graph inputs that are not initializers become placeholders, their first dimension
(symbolic or not) the batch; initializers become parameters (trainable unless
``freeze``), ``Constant`` nodes frozen ones; every node becomes an op of one
FORWARD_ONLY path ``infer``, and the graph outputs its declared outputs.  ONNX's
constant inputs that are attributes here (Reshape's shape, ReduceSum's axes) must be
constants, and are read at import.  Unsupported operators are all listed in one error.

>>> from engine.models import paper_mlp
>>> from engine.onnx_io import export_onnx
>>> g = import_onnx(export_onnx(paper_mlp((4, 3, 2), train=False), outputs=["probs"]))
>>> [p.name for p in g.paths], g.outputs
(['infer'], ['probs'])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.graph import CalcGraph, Init, Mode
from engine.onnx_io.export import SAME

AXES_INPUT = ("ReduceSum", "ReduceMean", "Squeeze", "Unsqueeze")  # axes as input 1
DTYPES = {1: "float32", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}
IMPORTED = SAME | {"Reshape", "ReduceSum", "Dropout", "Constant", "Squeeze", "Unsqueeze",
                   "Clip", "Split", "Cast", "DequantizeLinear"}


def import_onnx(model: Any, freeze: bool = False, name: str | None = None,
                batch: bool = True, constants: dict[str, np.ndarray] | None = None
                ) -> CalcGraph:
    """A CalcGraph of ``model`` (an ``onnx.ModelProto`` or a path to one).

    ``batch=False`` keeps every input's shape as it is (no batch dimension);
    ``constants`` gives values for graph inputs that are really constants (a Reshape's
    shape fed as an input, as ONNX's node tests do)."""
    import onnx
    from onnx import numpy_helper

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise GraphError(f"not a valid ONNX model: {e}") from None
    domains = {o.domain for o in model.opset_import if o.domain not in ("", "ai.onnx")}
    if domains:
        raise GraphError(f"operators of domain(s) {sorted(domains)} are not supported")
    gr = model.graph
    unsupported = sorted({n.op_type for n in gr.node if n.op_type not in IMPORTED})
    if unsupported:
        raise GraphError(f"unsupported ONNX operator(s): {', '.join(unsupported)}; "
                         f"supported: {', '.join(sorted(IMPORTED))}")
    g = CalcGraph(name=name or gr.name or "onnx")
    consts: dict[str, np.ndarray] = dict(constants or {})
    for init in gr.initializer:
        arr = numpy_helper.to_array(init)
        consts[init.name] = arr
    init_names = {i.name for i in gr.initializer}
    for vi in gr.input:
        if vi.name in consts:
            continue
        t = vi.type.tensor_type
        if t.elem_type not in DTYPES:
            raise GraphError(f"input {vi.name!r}: ONNX element type {t.elem_type} is not "
                             f"supported (supported: {', '.join(DTYPES.values())})")
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if batch:
            shape = (0, *dims[1:]) if dims else ()
        elif 0 in dims:
            raise GraphError(f"input {vi.name!r} has a symbolic dimension; import with "
                             "batch=True")
        else:
            shape = tuple(dims)
        g.placeholder(vi.name, shape, dtype=DTYPES.get(t.elem_type, "float32"))
    used_as_attr: set[str] = set()
    nodes = []
    for node in gr.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            continue
        attrs = {a.name: _attr(a) for a in node.attribute}
        ins = [i for i in node.input if i]
        if node.op_type == "Reshape":
            attrs["shape"] = tuple(int(v) for v in _const(consts, ins[1], node))
            used_as_attr.add(ins[1])
            ins = ins[:1]
        elif node.op_type in AXES_INPUT and len(ins) > 1:
            attrs["axes"] = tuple(int(v) for v in _const(consts, ins[1], node))
            used_as_attr.add(ins[1])
            ins = ins[:1]
        elif node.op_type == "Split":
            if len(ins) > 1:
                attrs["split"] = tuple(int(v) for v in _const(consts, ins[1], node))
                used_as_attr.add(ins[1])
            elif not attrs.get("num_outputs"):
                attrs["num_outputs"] = len(node.output)
            ins = ins[:1]
        elif node.op_type == "Clip":
            for pos, key in ((1, "min"), (2, "max")):
                if pos < len(node.input) and node.input[pos]:
                    attrs[key] = _const(consts, node.input[pos], node).item()
                    used_as_attr.add(node.input[pos])
            ins = ins[:1]
        elif node.op_type == "DequantizeLinear":
            for pos, key in ((1, "scale"), (2, "zero_point")):
                if pos < len(node.input) and node.input[pos]:
                    v = _const(consts, node.input[pos], node)
                    attrs[key] = v.item() if v.ndim == 0 else tuple(v.ravel().tolist())
                    used_as_attr.add(node.input[pos])
            ins = ins[:1]
        elif node.op_type == "Dropout":
            ins = ins[:1]  # ratio and training_mode inputs: inference
            attrs = {"training": 0}
        nodes.append((node, ins, attrs))
    for cname, arr in consts.items():
        if cname in used_as_attr and not any(cname in ins for _, ins, _ in nodes):
            continue
        if arr.dtype.kind not in "fiub":
            raise GraphError(f"initializer {cname!r} has dtype {arr.dtype}")
        values = arr.astype(np.float64).ravel().tolist()
        g.parameter(cname, arr.shape, init=Init.from_values(values),
                    dtype=str(arr.dtype) if str(arr.dtype) in DTYPES.values() else "float32",
                    trainable=not freeze and cname in init_names and arr.dtype.kind == "f")
    path = g.path("infer", Mode.FORWARD_ONLY)
    for node, ins, attrs in nodes:
        path.op(node.op_type, *ins, outputs=list(node.output), **attrs)
    g.output(*[o.name for o in gr.output])
    return g


def _const(consts: dict[str, np.ndarray], name: str, node: Any) -> np.ndarray:
    if name not in consts:
        raise GraphError(f"node {node.name or node.op_type!r}: input {name!r} must be a "
                         "constant (an initializer or a Constant node)")
    return consts[name]


def _attr(a: Any) -> Any:
    from onnx import helper

    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
    return v
