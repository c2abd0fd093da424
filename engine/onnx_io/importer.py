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

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import GraphError
from engine.graph import CalcGraph, Init, Mode
from engine.onnx_io.fold import fold_model
from engine.onnx_io.safety import load_model
from engine.ops import OP_TABLE, OpDef
from engine.ops._onnx import OnnxForm

DTYPES = {1: "float32", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}
# The ONNX operators the op table reads (OpDef.onnx), and Constant, which fold_model folds
FORMS: dict[str, tuple[OpDef, OnnxForm]] = {
    op.onnx.name: (op, op.onnx) for op in OP_TABLE.values()
    if isinstance(op.onnx, OnnxForm) and op.onnx.imports}
IMPORTED = set(FORMS) | {"Constant"}


@dataclass
class _Import:
    """What the ops' import converters read of the model (:class:`ImportContext`)."""

    consts: dict[str, np.ndarray]
    batch: bool
    training: bool
    opset: int
    shapes: dict[str, tuple[int, ...]]
    declared_batch: int | None = None
    stats: set[str] = field(default_factory=set)  # running statistics: state, not weights

    producers: dict[str, Any] = field(default_factory=dict)  # the kept nodes, by output

    def const(self, name: str, node: Any) -> np.ndarray:
        if name not in self.consts and self._from_shape(name):
            raise GraphError(
                f"node {node.name or node.op_type!r}: input {name!r} must be a constant, "
                "and it is computed at run time from a Shape: of a dimension not known at "
                "import (dynamic, other than the leading batch), or by arithmetic on the "
                "batch size (x.view(batch * heads, ...)); export the model with those sizes "
                "fixed, or keep the batch first and reshape with 0 or -1 for it")
        return _const(self.consts, name, node)

    def _from_shape(self, name: str, most: int = 64) -> bool:
        """Whether a Shape node is among the first ``most`` producers of ``name``."""
        todo: list[str] = [name]
        seen: set[int] = set()
        while todo and len(seen) < most:
            node = self.producers.get(todo.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Shape":
                return True
            todo.extend(i for i in node.input if i)
        return False

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def state(self, names: list[str]) -> None:
        self.stats.update(names)


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
    ctx = _Import(consts, batch, bool(loss), opset, shapes,
                  producers={o: n for n in kept for o in n.output if o})
    for vi in gr.input:
        if vi.name in consts:
            continue
        t = vi.type.tensor_type
        if t.elem_type not in DTYPES:
            raise GraphError(f"input {vi.name!r}: ONNX element type {t.elem_type} is not "
                             f"supported (supported: {', '.join(DTYPES.values())})")
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if batch and dims and ctx.declared_batch is None:
            ctx.declared_batch = dims[0]  # the first input's leading dimension as written
        if batch:
            shape = (0, *dims[1:]) if dims else ()
        elif 0 in dims:
            raise GraphError(f"input {vi.name!r} has a symbolic dimension; import with "
                             "batch=True")
        else:
            shape = tuple(dims)
        g.placeholder(vi.name, shape, dtype=DTYPES.get(t.elem_type, "float32"))
    nodes = []
    for node in kept:
        attrs = {a.name: _attr(a) for a in node.attribute}
        ins = [i for i in node.input if i]
        form = FORMS[node.op_type][1]
        if form.import_ is not None:
            ins, attrs = form.import_(ctx, node, ins, attrs)
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
                    cname not in ctx.stats)
    path = g.path("train", Mode.BACKWARD_ENABLED) if loss else g.path("infer",
                                                                       Mode.FORWARD_ONLY)
    for node, ins, attrs in nodes:
        op, form = FORMS[node.op_type]
        if form.build is None or not form.build(ctx, path, node, ins, attrs):
            path.op(op.name, *ins, outputs=list(node.output), **attrs)
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
