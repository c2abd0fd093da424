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
from engine.onnx_io.fold import fold_model
from engine.onnx_io.safety import load_model

AXES_INPUT = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze",
              "Unsqueeze")  # axes as input 1 (from opset 13 or 18)
DTYPES = {1: "float32", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}
IMPORTED = SAME | {"Reshape", "ReduceSum", "Dropout", "Constant", "Squeeze", "Unsqueeze",
                   "Clip", "Split", "Cast", "DequantizeLinear", "ConstantOfShape",
                   "Slice", "Pad"}


def import_onnx(model: Any, freeze: bool = False, name: str | None = None,
                batch: bool = True, constants: dict[str, np.ndarray] | None = None,
                loss: str | None = None) -> CalcGraph:
    """A CalcGraph of ``model`` (an ``onnx.ModelProto`` or a path to one).

    ``batch=False`` keeps every input's shape as it is (no batch dimension);
    ``constants`` gives values for graph inputs that are really constants (a Reshape's
    shape fed as an input, as ONNX's node tests do).

    Without ``loss`` the graph has one FORWARD_ONLY path, ``infer``.  With it, the path
    is ``train`` (BACKWARD_ENABLED): Dropout draws, BatchNormalization normalises with
    the batch's statistics and updates its running ones in place, and the loss is
    ``"cross_entropy"`` (an int64 placeholder ``labels`` and softmax cross-entropy on
    the model's logits: the input of a final Softmax, else its first output) or the
    name of a scalar value the model computes.  Initializers are trainable parameters
    unless ``freeze``; BatchNormalization's running statistics never are."""
    import onnx
    from onnx import numpy_helper

    model = load_model(model)  # external data read safely, sizes checked
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise GraphError(f"not a valid ONNX model: {e}") from None
    domains = {o.domain for o in model.opset_import if o.domain not in ("", "ai.onnx")}
    if domains:
        raise GraphError(f"operators of domain(s) {sorted(domains)} are not supported")
    gr = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    consts: dict[str, np.ndarray] = dict(constants or {})
    for init in gr.initializer:
        arr = numpy_helper.to_array(init)
        consts[init.name] = arr
    init_names = {i.name for i in gr.initializer}
    trainable = set() if freeze else {n for n in init_names if consts[n].dtype.kind == "f"}
    consts, kept, generated, shapes = fold_model(model, consts, batch, trainable, not freeze,
                                                opset)
    unsupported = sorted({n.op_type for n in kept if n.op_type not in IMPORTED})
    if unsupported:
        raise GraphError(f"unsupported ONNX operator(s): {', '.join(unsupported)}; "
                         f"supported: {', '.join(sorted(IMPORTED))}")
    g = CalcGraph(name=name or gr.name or "onnx")
    declared_batch: int | None = None  # the first input's leading dimension as written
    for vi in gr.input:
        if vi.name in consts:
            continue
        t = vi.type.tensor_type
        if t.elem_type not in DTYPES:
            raise GraphError(f"input {vi.name!r}: ONNX element type {t.elem_type} is not "
                             f"supported (supported: {', '.join(DTYPES.values())})")
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if batch and dims and declared_batch is None:
            declared_batch = dims[0]
        if batch:
            shape = (0, *dims[1:]) if dims else ()
        elif 0 in dims:
            raise GraphError(f"input {vi.name!r} has a symbolic dimension; import with "
                             "batch=True")
        else:
            shape = tuple(dims)
        g.placeholder(vi.name, shape, dtype=DTYPES.get(t.elem_type, "float32"))
    stats: set[str] = set()  # BatchNormalization's running statistics: state, not weights
    nodes = []
    for node in kept:
        attrs = {a.name: _attr(a) for a in node.attribute}
        ins = [i for i in node.input if i]
        if node.op_type == "Reshape":
            target = [int(v) for v in _const(consts, ins[1], node)]
            # With a batch dimension, a leading dimension written as the model's batch
            # size (or -1) is the batch: 0 keeps it, as this engine requires.
            if batch and target and ins[0] not in consts and \
                    target[0] in (-1, declared_batch) and len(target) > 1:
                target[0] = 0
            attrs["shape"] = tuple(target)
            ins = ins[:1]
        elif node.op_type in AXES_INPUT and len(ins) > 1:
            attrs["axes"] = tuple(int(v) for v in _const(consts, ins[1], node))
            ins = ins[:1]
        elif node.op_type == "Split":
            if len(ins) > 1:
                attrs["split"] = tuple(int(v) for v in _const(consts, ins[1], node))
            elif not attrs.get("num_outputs"):
                attrs["num_outputs"] = len(node.output)
            ins = ins[:1]
        elif node.op_type in INPUTS_AS_ATTRS:
            for pos, key in enumerate(INPUTS_AS_ATTRS[node.op_type], start=1):
                if pos < len(node.input) and node.input[pos]:
                    v = _const(consts, node.input[pos], node)  # a scalar, or a tuple
                    attrs[key] = v.item() if v.ndim == 0 else tuple(v.ravel().tolist())
            ins = ins[:1]
        elif node.op_type == "Dropout":
            ins = ins[:1]  # ratio and training_mode inputs: the path decides
            attrs = {"ratio": attrs.get("ratio", 0.5)} if loss else {"training": 0}
            if loss and len(node.input) > 1 and node.input[1]:
                attrs["ratio"] = float(_const(consts, node.input[1], node))
        elif node.op_type == "BatchNormalization":
            stats.update(ins[3:5])
            if loss:
                attrs.update(training_mode=1, running_update=1)
        nodes.append((node, ins, attrs))
    read = {i for _, ins, _ in nodes for i in ins} | {o.name for o in gr.output}
    for cname, arr in consts.items():
        if cname not in read:  # folded away, or only read into an attribute
            continue
        if arr.dtype.kind not in "fiub":
            raise GraphError(f"initializer {cname!r} has dtype {arr.dtype}")
        if cname in generated or (arr.size > 1 and (arr == arr.flat[0]).all()):
            init = Init.constant(float(arr.flat[0]))  # no list of a million equal values
        else:
            init = Init.from_array(arr)
        weights = cname in init_names or cname in generated
        g.parameter(cname, arr.shape, init=init,
                    dtype=str(arr.dtype) if str(arr.dtype) in DTYPES.values() else "float32",
                    trainable=not freeze and weights and arr.dtype.kind == "f" and
                    cname not in stats)
    path = g.path("train", Mode.BACKWARD_ENABLED) if loss else g.path("infer",
                                                                       Mode.FORWARD_ONLY)
    for node, ins, attrs in nodes:
        if node.op_type in COERCED_2D and opset < 13:
            _coerced_softmax(path, node, ins, attrs, shapes)
            continue
        if node.op_type == "Conv" and len(shapes.get(ins[1], ())) == 3:
            _conv_1d(path, node, ins, attrs)
            continue
        path.op(node.op_type, *ins, outputs=list(node.output), **attrs)
    g.output(*[o.name for o in gr.output])
    if loss:
        _add_loss(g, path, loss, [(n, i) for n, i, _ in nodes], gr.output[0].name)
    return g


def _add_loss(g: CalcGraph, path: Any, loss: str, nodes: list[tuple[Any, list[str]]],
              output: str) -> None:
    """Set the training path's loss: a value of the model, or cross-entropy against an
    added ``labels`` placeholder on the logits (before a final Softmax)."""
    if loss != "cross_entropy":
        if loss not in g.variables:
            raise GraphError(f"loss {loss!r} is not a value of the model; give a value's "
                             "name or 'cross_entropy'")
        path.set_loss(loss)
        return
    logits = output
    for node, ins in nodes:
        if output in node.output and node.op_type == "Softmax":
            logits = ins[0]
    # [N, classes, 1, 1] as SqueezeNet's to [N, classes]; a no-op (removed) on 2-D logits
    logits = path.Flatten(logits, axis=1).name
    labels = g.placeholder("labels", (0,), dtype="int64")
    value, _ = path.SoftmaxCrossEntropyLoss(logits, labels, outputs=["loss", "loss:log_prob"])
    path.set_loss(value)
    g.output(value)


# Constant inputs read into attributes, by position from 1
INPUTS_AS_ATTRS = {"Slice": ("starts", "ends", "axes", "steps"),
                   "Pad": ("pads", "value", "axes"), "Clip": ("min", "max"),
                   "DequantizeLinear": ("scale", "zero_point")}
COERCED_2D = ("Softmax", "LogSoftmax", "Hardmax")  # before opset 13: over all axes from `axis` on


def _conv_1d(path: Any, node: Any, ins: list[str], attrs: dict[str, Any]) -> None:
    """A 1-D convolution as the 2-D one of a height-1 image: Unsqueeze, Conv, Squeeze
    (views, free in place)."""
    x, w = (path.Unsqueeze(v, axes=(2,)) for v in ins[:2])
    two = dict(attrs)
    for key, lead in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if attrs.get(key):
            two[key] = (lead, *attrs[key])
    if attrs.get("pads"):
        two["pads"] = (0, attrs["pads"][0], 0, attrs["pads"][1])
    y = path.Conv(x, w, *ins[2:], **two)
    path.Squeeze(y, axes=(2,), outputs=list(node.output))


def _coerced_softmax(path: Any, node: Any, ins: list[str], attrs: dict[str, Any],
                     shapes: dict[str, tuple[int, ...]]) -> None:
    """Softmax before opset 13: the input is viewed as 2-D, ``[prod(dims[:axis]),
    prod(dims[axis:])]``, with ``axis`` 1 by default; as Flatten, Softmax, Reshape."""
    axis = int(attrs.get("axis", 1))
    shape = shapes.get(ins[0])
    if shape is None:
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}, opset < 13): "
                         f"the rank of {ins[0]!r} is unknown")
    axis %= max(len(shape), 1)
    if axis == len(shape) - 1:
        path.op(node.op_type, *ins, outputs=list(node.output), axis=axis)
        return
    if 0 in shape[axis:]:
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}, opset < 13): "
                         f"the dimensions after axis {axis} of {shape} must be known")
    flat = path.Flatten(ins[0], axis=axis)
    soft = path.op(node.op_type, flat, axis=1)
    path.Reshape(soft, shape=(0,) * axis + tuple(shape[axis:]), outputs=list(node.output))


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
