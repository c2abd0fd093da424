"""Reverse-mode differentiation of BACKWARD_ENABLED paths.

A driver of a few lines over the op table's gradient rules (tinygrad's
``gradient.py``): walk the path backwards from its loss, ask each op's rule for its
inputs' gradients — rules emit ordinary ops, so the backward program gets shape
inference and memory planning like the forward one — and sum the contributions of
variables used more than once.  It fails loudly when a non-differentiable op lies
between a parameter and the loss.

A parameter's gradient is written by one *sink* node per path; the interpreter binds
that node either to write the gradient buffer (the first backward after
``optimize()``) or to accumulate into it (technical batches of one learning batch).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.compile.passes.ir import IR, IRNode, IRParam, IRPath
from engine.compile.passes.shapes import node_descs
from engine.errors import GraphError
from engine.graph import Init, TensorDesc
from engine.ops import NodeView, NonDifferentiable, get_op
from engine.runtime.zones import FORWARD, GRADIENT


class _Builder:
    """The GradBuilder the rules see: emits backward nodes with inferred shapes."""

    def __init__(self, ir: IR, path: IRPath, pi: int) -> None:
        self.ir, self.path, self.pi = ir, path, pi
        self._origin = ""
        self.origins: dict[str, str] = {}  # op -> its nodes' origin (one string each)
        self.count = 0
        self.prefix = f"{path.name}/grad"
        self.producer: dict[str, IRNode] = {}  # each output -> the node that computes it
        self.read: set[str] = set()  # every value a backward node reads

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        opdef = get_op(op)
        self.count += 1
        name = f"{self.prefix}{self.count}:{op}"
        origin = self.origins.get(op)
        if origin is None:
            origin = self.origins[op] = f"{op} in the gradient of {self.origin}"
        node = IRNode(op, inputs, (name,), opdef.with_defaults(attrs), self.pi,
                      backward=True, origin=origin)
        ir = self.ir
        descs = node_descs(ir, node, opdef)
        if len(descs) == 1:
            ir.descs[name] = descs[0]
            ir.zone[name] = GRADIENT
            ir.kind[name] = "generic"
            self.producer[name] = node
        else:
            node.outputs = (name, *[f"{name}:{i}" for i in range(1, len(descs))])
            for o, d in zip(node.outputs, descs, strict=True):
                ir.descs[o] = d
                ir.zone[o] = GRADIENT
                ir.kind[o] = "generic"
                self.producer[o] = node
        self.read.update(inputs)
        self.path.backward.append(node)
        return name

    @property
    def origin(self) -> str:
        """What the nodes emitted now are the gradient of (for error messages)."""
        return self._origin

    @origin.setter
    def origin(self, what: str) -> None:
        if what != self._origin:
            self._origin = what
            self.origins = {}

    def desc(self, name: str) -> TensorDesc:
        return self.ir.descs[name]

    def const(self, value: float, like: str) -> str:
        dt = self.ir.descs[like].dtype
        name = f"const:{value!r}:{dt.value}"
        if name not in self.ir.params:
            self.ir.params[name] = IRParam(name, Init.from_values([value]), None, False)
            self.ir.descs[name] = self.ir.intern(TensorDesc(dt, ()))
            self.ir.zone[name] = FORWARD
            self.ir.kind[name] = "param"
        return name


def _ensure_scalar_loss(ir: IR, path: IRPath, pi: int) -> None:
    assert path.loss is not None
    d = ir.descs[path.loss]
    if not d.dtype.is_float:
        raise GraphError(f"path {path.name!r}: the loss {path.loss!r} is {d.dtype.value}; "
                         "it must be a float tensor")
    if d.shape == ():
        return
    name = f"{path.loss}:mean"
    node = IRNode("ReduceMean", (path.loss,), (name,),
                  get_op("ReduceMean").with_defaults({"keepdims": 0}), pi,
                  origin=f"the mean of the loss of path {path.name!r}")
    path.forward.append(node)
    ir.descs[name] = node_descs(ir, node)[0]
    ir.zone[name] = FORWARD
    ir.kind[name] = "generic"
    path.loss = name


def differentiate(ir: IR) -> IR:
    for pi, path in enumerate(ir.paths):
        if path.loss is None:
            continue
        _ensure_scalar_loss(ir, path, pi)
        _differentiate_path(ir, path, pi)
    return ir


def _differentiate_path(ir: IR, path: IRPath, pi: int) -> None:
    assert path.loss is not None
    trainable = {n for n, p in ir.params.items() if p.trainable}
    # Forward reachability: which variables depend on a trainable parameter here.
    needs = set(trainable)
    for node in path.forward:
        if not needs.isdisjoint(node.inputs):
            needs.update(node.outputs)
    if path.loss not in needs:
        raise GraphError(f"path {path.name!r}: the loss {path.loss!r} does not depend on any "
                         "trainable parameter, so there is nothing to learn")

    seed = f"{path.name}/seed"
    ir.descs[seed] = ir.descs[path.loss]
    ir.zone[seed] = GRADIENT
    ir.kind[seed] = "seed"
    path.seed = seed
    contribs: dict[str, list[str]] = {path.loss: [seed]}
    gb = _Builder(ir, path, pi)

    def total(var: str) -> str | None:
        parts = contribs.pop(var, None)
        if not parts:
            return None
        acc = parts[0]
        if len(parts) > 1:
            gb.origin = f"the sum of gradients of {var!r}"
            for p in parts[1:]:
                acc = gb.op("Add", acc, p)
        return acc

    pending = contribs.keys()
    for node in reversed(path.forward):
        if pending.isdisjoint(node.outputs):
            continue
        gouts = list(map(total, node.outputs))
        wanted = list(map(needs.__contains__, node.inputs))
        if not any(wanted):
            continue
        rule = get_op(node.op).grad
        if isinstance(rule, NonDifferentiable):
            raise GraphError(f"{node.origin}: has no gradient ({rule.reason}) but lies between "
                             f"a parameter and the loss {path.loss!r}")
        gb.origin = node.origin
        grads = rule(gb, NodeView(node.op, node.inputs, node.outputs, node.attrs), gouts)
        for x, g, w in zip(node.inputs, grads, wanted, strict=True):
            if g is not None and w:
                contribs.setdefault(x, []).append(g)

    finals = {n: total(n) for n in ir.params if n in trainable}
    shared = Counter(g for g in finals.values() if g is not None)
    # An Identity a sink adds reads one final gradient (another reading it is shared
    # anyway) and computes a new name: the answers below stay those before the sinks.
    for name, g in finals.items():
        if g is None:
            continue
        path.params.append(name)
        _attach_sink(ir, path, gb, name, g, shared[g] > 1 or g in gb.read,
                     gb.producer.get(g))
    _prune(ir, path)


def _prune(ir: IR, path: IRPath) -> None:
    """Drop backward nodes nothing reads: rules emit the gradient of every input, and
    those of placeholders (the data) are not wanted."""
    live: set[str] = set()
    kept: list[IRNode] = []
    for node in reversed(path.backward):
        if node.param_sink is not None or not live.isdisjoint(node.outputs):
            kept.append(node)
            live.update(node.inputs)
        else:
            for o in node.outputs:
                ir.descs.pop(o, None)
                ir.zone.pop(o, None)
    path.backward = kept[::-1]


def _attach_sink(ir: IR, path: IRPath, gb: _Builder, param: str, g: str, shared: bool,
                 producer: IRNode | None) -> None:
    """Make one backward node write ``param``'s gradient buffer (an Identity copy when
    the gradient is also read elsewhere or is another parameter's too)."""
    grad = f"{param}.grad"
    ir.grad_of[param] = grad
    ir.descs[grad] = ir.descs[param]
    ir.zone[grad] = GRADIENT
    ir.kind[grad] = "grad"
    if producer is None or shared or producer.outputs[0] != g or len(producer.outputs) > 1:
        gb.origin = f"the gradient of parameter {param!r}"
        gb.op("Identity", g)
        producer = path.backward[-1]
    if ir.descs[producer.outputs[0]] != ir.descs[param]:
        raise GraphError(f"gradient of {param!r} has shape {ir.descs[producer.outputs[0]]}, "
                         f"the parameter {ir.descs[param]}")
    del ir.descs[producer.outputs[0]]
    producer.outputs = (grad,)
    producer.param_sink = param

