"""Reverse-mode differentiation of BACKWARD_ENABLED paths.

A driver of a few lines over the op table's gradient rules (tinygrad's
``gradient.py``): walk the path backwards from its loss, ask each op's rule for its
inputs' gradients — rules emit ordinary ops, so the backward program gets shape
inference and memory planning like the forward one — and sum the contributions of
variables used more than once.  It fails loudly when a non-differentiable op lies
between a parameter and the loss.  A rule is asked once or twice per distinct node
signature; nodes alike replay what it emitted (:class:`_Builder`).

A parameter's gradient is written by one *sink* node per path; the interpreter binds
that node either to write the gradient buffer (the first backward after
``optimize()``) or to accumulate into it (technical batches of one learning batch).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from engine.compile.passes.ir import IR, IRNode, IRParam, IRPath
from engine.compile.passes.shapes import node_descs, rule_key
from engine.errors import GraphError
from engine.graph import Init, TensorDesc
from engine.ops import NodeView, NonDifferentiable, get_op
from engine.ops._base import GradRule
from engine.runtime.zones import FORWARD, GRADIENT

# A gradient rule's emissions for one node signature, up to names: each step's op,
# inputs (indices into a table of the node's names, the constants, then the outputs of
# the steps so far), defaulted attributes and output descriptors; then the gradients
# (indices, or None).
_Step = tuple[str, tuple[int, ...], dict[str, Any], list[TensorDesc]]
_Tape = tuple[list[_Step], list[int | None], tuple[str, ...]]


class _Builder:
    """The GradBuilder the rules see: emits backward nodes with inferred shapes.

    Rules are pure: asked for the gradient of a node with the same signature as an
    earlier one (op, attributes, descriptors, which of its names are equal and which
    gradients are missing), a rule emits the same ops up to names.  So the second time
    a signature comes, the builder records what the rule emits, and from then on
    replays that instead of asking the rule (:meth:`gradient`).  A generated 10,000-node
    graph has a handful of distinct signatures; a graph without repeats records
    nothing."""

    def __init__(self, ir: IR, path: IRPath, pi: int) -> None:
        self.ir, self.path, self.pi = ir, path, pi
        self._origin = ""
        self.origins: dict[str, str] = {}  # op -> its nodes' origin (one string each)
        self.count = 0
        self.prefix = f"{path.name}/grad"
        self.tapes: dict[tuple[Any, ...], _Tape | None] = {}  # None: cannot be replayed
        self.seen: set[tuple[Any, ...]] = set()  # signatures met once
        # (op, ids of the input descriptors) -> (defaulted attributes, output descriptors)
        # for ops emitted without attributes; the IR interns the descriptors
        self.made: dict[tuple[Any, ...], tuple[dict[str, Any], list[TensorDesc]]] = {}
        self._steps: list[tuple[str, tuple[str, ...], dict[str, Any], list[TensorDesc],
                                tuple[str, ...]]] | None = None  # recording, if a list
        self._consts: dict[str, None] = {}  # the constants the recorded rule asked for

    def gradient(self, rule: GradRule, node: IRNode,
                 gouts: list[str | None]) -> list[str | None]:
        """``rule``'s gradients of ``node``'s inputs, given its outputs' (``gouts``)."""
        names = (*node.inputs, *node.outputs, *gouts)
        descs = self.ir.descs
        key = rule_key(node.op, [None if x is None else descs[x] for x in names], node.attrs,
                       len(node.inputs), len(node.outputs), *map(names.index, names))
        if key in self.tapes:
            tape = self.tapes[key]
            if tape is not None:
                return self._replay(tape, names)
        view = NodeView(node.op, node.inputs, node.outputs, node.attrs)
        if key is None or key in self.tapes or key not in self.seen:
            if key is not None:  # recorded when it comes again: a graph without repeats
                self.seen.add(key)  # records nothing
            return rule(self, view, gouts)
        self._steps, self._consts = [], {}
        try:
            grads: list[str | None] = rule(self, view, gouts)
            self.tapes[key] = self._tape(names, grads)
        finally:
            self._steps = None
        return grads

    def _tape(self, names: tuple[str | None, ...], grads: list[str | None]) -> _Tape | None:
        """What the recording of a rule on a node with ``names`` replays, or None if a
        step reads a value that is neither one of them, a constant nor made before."""
        assert self._steps is not None
        consts = tuple(self._consts)
        table = {x: i for i, x in reversed(list(enumerate((*names, *consts))))
                 if x is not None}
        n = len(names) + len(consts)
        steps: list[_Step] = []
        for op, inputs, attrs, descs, outputs in self._steps:
            if not table.keys() >= set(inputs):
                return None
            steps.append((op, tuple(map(table.__getitem__, inputs)), attrs, descs))
            for o in outputs:
                table.setdefault(o, n)
                n += 1
        if any(g is not None and g not in table for g in grads):
            return None
        return steps, [None if g is None else table[g] for g in grads], consts

    def _replay(self, tape: _Tape, names: tuple[str | None, ...]) -> list[str | None]:
        steps, grads, consts = tape
        table = cast(list[str], [*names, *consts])  # steps read no missing gradient
        for op, refs, attrs, descs in steps:
            self.count += 1
            name = f"{self.prefix}{self.count}:{op}"
            origin = self.origins.get(op)
            if origin is None:
                origin = self.origins[op] = f"{op} in the gradient of {self.origin}"
            node = IRNode(op, tuple(map(table.__getitem__, refs)), (name,), dict(attrs),
                          self.pi, True, None, origin)
            self._add(node, descs)
            table.extend(node.outputs)
        return [None if g is None else table[g] for g in grads]

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        self.count += 1
        name = f"{self.prefix}{self.count}:{op}"
        origin = self.origins.get(op)
        if origin is None:
            origin = self.origins[op] = f"{op} in the gradient of {self.origin}"
        # Ops without attributes (the sums of gradients above all) by their op and input
        # descriptors: their defaulted attributes and output descriptors.
        key = (op, *map(id, map(self.ir.descs.__getitem__, inputs))) if not attrs else None
        made = self.made.get(key) if key is not None else None
        if made is None:
            opdef = get_op(op)
            node = IRNode(op, inputs, (name,), opdef.with_defaults(attrs), self.pi, True,
                          None, origin)
            descs = node_descs(self.ir, node, opdef)
            if key is not None:
                self.made[key] = (dict(node.attrs), descs)
        else:  # each node owns its attributes (emit hands them to the instructions)
            node = IRNode(op, inputs, (name,), dict(made[0]), self.pi, True, None, origin)
            descs = made[1]
        self._add(node, descs)
        if self._steps is not None:
            self._steps.append((op, inputs, dict(node.attrs), descs, node.outputs))
        return name

    def _add(self, node: IRNode, descs: list[TensorDesc]) -> None:
        """Append ``node`` (one output named) computing ``descs``."""
        ir = self.ir
        name = node.outputs[0]
        if len(descs) == 1:
            ir.descs[name] = descs[0]
            ir.zone[name] = GRADIENT
            ir.kind[name] = "generic"
        else:
            node.outputs = (name, *[f"{name}:{i}" for i in range(1, len(descs))])
            for o, d in zip(node.outputs, descs, strict=True):
                ir.descs[o] = d
                ir.zone[o] = GRADIENT
                ir.kind[o] = "generic"
        self.path.backward.append(node)

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
        if self._steps is not None:
            self._consts[name] = None
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
        grads = gb.gradient(rule, node, gouts)
        for x, g, w in zip(node.inputs, grads, wanted, strict=True):
            if g is not None and w:
                contribs.setdefault(x, []).append(g)

    finals = {n: total(n) for n in ir.params if n in trainable}
    read, producer = _prune(ir, path, {g for g in finals.values() if g is not None})
    shared = Counter(g for g in finals.values() if g is not None)
    for name, g in finals.items():
        if g is None:
            continue
        path.params.append(name)
        _attach_sink(ir, path, gb, name, g, shared[g] > 1 or g in read, producer.get(g))


def _prune(ir: IR, path: IRPath, finals: set[str]) -> tuple[set[str], dict[str, IRNode]]:
    """Drop backward nodes nothing needs (rules emit the gradient of every input, and
    those of placeholders, the data, are not wanted); a parameter's final gradient is
    needed.  Returns the final gradients some backward node reads (they get an
    Identity sink), and the node computing each of the others."""
    live: set[str] = set()  # read by a kept node after this one
    read_by_dropped: set[str] = set()
    producer: dict[str, IRNode] = {}
    kept: list[IRNode] = []
    for node in reversed(path.backward):
        if live.isdisjoint(node.outputs):
            if finals.isdisjoint(node.outputs):
                read_by_dropped.update(node.inputs)
                for o in node.outputs:
                    ir.descs.pop(o, None)
                    ir.zone.pop(o, None)
                continue
            producer.update((o, node) for o in node.outputs if o in finals)
        kept.append(node)
        live.update(node.inputs)
    path.backward = kept[::-1]
    return {g for g in finals if g in live or g in read_by_dropped}, producer


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
    ir.drop(producer.outputs[0])
    producer.outputs = (grad,)
    producer.param_sink = param

