"""Horizontal fusion: K models of one architecture trained side by side as one program.

Trials of a hyperparameter search often share their architecture and differ only in
learning rate or initialisation (the CalcGraph paper's multi-model scenario).  At
small batch sizes each of them spends most of a step in per-instruction overhead,
not arithmetic.  :func:`stack_graphs` rewrites K such graphs into one whose
parameters gain a leading model axis (``[K, ...]``) and whose activations are laid
out ``[batch, K, ...]``: every instruction then does K models' work for one
dispatch, the data each step reads is shared, and the dense layers become one BLAS
call per model on strided views (:mod:`engine.ops.stacked`).  Each model keeps its
own initialisation (:meth:`Init.stacked`), learning rate and SGD's momentum
(:class:`~engine.runtime.optim.PerModelLR`); the gradient of the summed per-model losses is
each model's own gradient, since the models share no parameter.

The result is an ordinary :class:`~engine.runtime.program.Program`: it is sized exactly,
switched in and out of an arena like any model, and reads back per model
(``vm.get("loss")[k]``, :func:`member_params`).

Each op's :class:`~engine.ops.StackRule` (``OpDef.stacking``) names its rule here.
Rules cover the dense-network family (what :func:`engine.models.paper_mlp`,
:func:`engine.models.deep_mlp` and the search spaces' MLPs are built from):
``Gemm``/``MatMul`` by a weight parameter, elementwise activations, casts and dropout,
elementwise arithmetic, comparisons and ``Where`` whose broadcasting keeps the model
axis aligned (a mask, ``h * (h > 0)``), ``SoftmaxCrossEntropyLoss`` and ``Accuracy``.
Any other op raises
:class:`StackError` naming it, and the caller trains those models one by one.

>>> import numpy as np
>>> from engine import SGD, VM, compile_graph
>>> from engine.graph import Init
>>> from engine.models import paper_mlp
>>> graphs = [paper_mlp((4, 8, 3), init=i) for i in (Init.xavier_uniform(), Init.he_uniform())]
>>> prog = compile_graph(stack_graphs(graphs), batch_size=16,
...                      optimizer=stack_optimizers([SGD(lr=0.1), SGD(lr=0.5)]))
>>> vm = VM(prog)
>>> x = np.random.default_rng(0).random((16, 4), dtype=np.float32); y = np.arange(16) % 3
>>> vm.set("x", x); vm.set("y", y); vm.train_step("train")
>>> vm.get("loss").shape, member_params(vm, 1)["w0"].shape
((2,), (4, 8))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.compile.passes.shapes import infer_shapes
from engine.compile.passes.validate import validate
from engine.errors import GraphError
from engine.graph import CalcGraph, Init, Kind, Node, Path
from engine.ops import StackRule, get_op
from engine.runtime.optim import SGD, Optimizer, PerModelLR


class StackError(GraphError):
    """The graphs cannot be stacked: they differ, or an op has no stacking rule."""


@dataclass(frozen=True)
class _Layout:
    """Where a stacked value keeps its model axis: ``kpos`` axes from the right
    (``[b, K, *s]`` and ``[K, *s]`` both have ``kpos = len(s) + 1``)."""

    kpos: int
    batched: bool


def stack_graphs(graphs: Sequence[CalcGraph], name: str | None = None) -> CalcGraph:
    """One graph training ``len(graphs)`` models: the graphs must be the same but for
    their parameters' inits (see the module docstring)."""
    if not graphs:
        raise StackError("stack_graphs needs at least one graph")
    first = graphs[0]
    _check_same(graphs)
    return _Stacker(first, graphs).run(name or f"{first.name}[x{len(graphs)}]")


def stack_optimizers(optimizers: Sequence[Optimizer]) -> PerModelLR:
    """One optimizer for a stack: the same kind and hyperparameters but for the
    learning rate, and SGD's momentum where every model has one, which each model keeps
    (:class:`~engine.runtime.optim.PerModelLR`)."""
    if not optimizers:
        raise StackError("stack_optimizers needs at least one optimizer")
    base = optimizers[0]
    for i, o in enumerate(optimizers[1:], 1):
        if stack_key(o) != stack_key(base):
            raise StackError(f"optimizer {i} ({o}) differs from optimizer 0 ({base}) in more "
                             "than the learning rate (and SGD's momentum): a stack shares "
                             "everything else")
    momenta = tuple(float(o.momentum) for o in optimizers if isinstance(o, SGD)) \
        if isinstance(base, SGD) and base.momentum else ()
    return PerModelLR(base=base, lrs=tuple(float(o.lr) for o in optimizers),
                      momenta=momenta if len(set(momenta)) > 1 else ())


def stack_key(optimizer: Optimizer) -> Optimizer:
    """What models must share to be stacked together, besides their architecture: all
    but the learning rate, and but SGD's momentum as long as it has one (a model
    without keeps no momentum buffer).

    >>> stack_key(SGD(lr=0.1, momentum=0.9)) == stack_key(SGD(lr=0.3, momentum=0.5))
    True
    >>> stack_key(SGD(lr=0.1, momentum=0.9)) == stack_key(SGD(lr=0.1))
    False
    """
    key = dataclasses.replace(optimizer, lr=0.0)
    if isinstance(key, SGD) and key.momentum:
        key = dataclasses.replace(key, momentum=1.0)
    return key


def stack_signature(graph: CalcGraph) -> str:
    """What graphs must share to be stacked together, all but their parameters' inits:
    graphs of equal signatures pass :func:`stack_graphs`'s check (a scheduler groups
    candidates by it before trying)."""
    variables = [(n, v.kind, v.desc, v.regularization, v.trainable)
                 for n, v in graph.variables.items()]
    paths = [(p.name, p.mode, p.loss, p.nodes) for p in graph.paths]
    return repr((variables, paths, graph.outputs))


def member_params(vm: Any, k: int) -> dict[str, np.ndarray]:
    """Model ``k``'s parameters, by name, from a VM running a stacked program."""
    prog = vm.program
    out = {}
    for ps in prog.params:
        spec = prog.buffers[ps.buffer]
        if ps.init.method == "stacked":
            out[spec.name] = np.ascontiguousarray(ps.init.member(vm.get(spec.name), k))
    return out


class _Stacker:
    def __init__(self, first: CalcGraph, graphs: Sequence[CalcGraph]) -> None:
        self.first = first
        self.graphs = graphs
        self.k = len(graphs)
        self.descs = infer_shapes(validate(first)).descs
        self.layout: dict[str, _Layout] = {}
        self.params: set[str] = set()
        # weights stored [in, K, out], and those of them each model holds [out, in]
        self.interleaved, self.transposed = self._data_fed_weights()

    def _data_fed_weights(self) -> tuple[set[str], set[str]]:
        """Weights of dense layers fed by shared data: stored ``[in, K, out]``, the
        layer is one GEMM for all the models (``x @ W`` seen as ``[in, K*out]``, an
        untransposed product, the faster one) and so is its weight gradient, instead of
        K smaller ones; and each input feature's weights of every model are one
        contiguous row, what a product that skips the data's zeros reads
        (``algorithm="sparse"``).  A model's ``[out, in]`` weight (``transB``, PyTorch's
        ``Linear``) is stored so too, each model's slice transposed
        (:meth:`Init.member` gives it back as ``[out, in]``): the second set.  A weight
        read both ways keeps the model's layout."""
        derived = {n for n, v in self.first.variables.items()
                   if v.kind == Kind.PARAMETER and v.trainable}
        flipped: set[str] = set()  # read by a product with transB
        plain: set[str] = set()
        other_use: set[str] = set()
        for path in self.first.paths:
            for node in path.nodes:
                if get_op(node.op).stacking is StackRule.DENSE and len(node.inputs) >= 2 and \
                        node.inputs[0] not in derived:
                    (flipped if node.attrs.get("transB", 0) else plain).add(node.inputs[1])
                    other_use.update(node.inputs[2:])
                else:
                    other_use.update(node.inputs)
                if any(i in derived for i in node.inputs):
                    derived.update(node.outputs)
        interleaved = {w for w in (flipped ^ plain) - other_use
                       if len(self.first.variables[w].desc.shape) == 2}  # type: ignore[union-attr]
        return interleaved, flipped & interleaved

    def run(self, name: str) -> CalcGraph:
        out = CalcGraph(device=self.first.device, name=name)
        for vname, v in self.first.variables.items():
            if v.kind == Kind.PLACEHOLDER:
                assert v.desc is not None
                out.placeholder(vname, v.desc.shape, v.desc.dtype)
            elif v.kind == Kind.PARAMETER:
                self._parameter(out, vname)
        losses = []
        for path in self.first.paths:
            p = out.path(path.name, path.mode)
            for node in path.nodes:
                self._node(p, node)
            if path.loss is not None:
                losses.append(path.loss)
                if path.loss in self.layout:  # the sum of the models' losses
                    total = p.ReduceSum(path.loss, keepdims=0, outputs=[f"{path.loss}_total"])
                    p.set_loss(total)
                else:
                    p.set_loss(path.loss)
        # What the user reads back: the declared outputs (or every leaf) and the
        # per-model losses, which the summed loss now reads.
        kept = list(self.first.outputs) or _leaves(self.first)
        out.output(*dict.fromkeys([*kept, *losses]))
        return out

    def _parameter(self, out: CalcGraph, vname: str) -> None:
        vs = [g.variables[vname] for g in self.graphs]
        v = vs[0]
        assert v.desc is not None
        inits = [x.init or Init.xavier_uniform() for x in vs]
        if not v.trainable and all(i == inits[0] for i in inits):  # a constant: shared
            out.parameter(vname, v.desc.shape, inits[0], v.regularization, v.desc.dtype,
                          trainable=False)
            return
        flip = vname in self.transposed
        shape = v.desc.shape[::-1] if flip else v.desc.shape
        axis = 1 if vname in self.interleaved else 0
        out.parameter(vname, (*shape[:axis], self.k, *shape[axis:]),
                      Init.stacked(inits, model_axis=axis, transposed=flip),
                      v.regularization, v.desc.dtype, v.trainable)
        self.layout[vname] = _Layout(len(shape) + 1 - axis, batched=False)
        self.params.add(vname)

    def _rank(self, name: str) -> int:
        """Axes of ``name`` besides the batch."""
        shape = self.descs[name].shape
        return len(shape) - (1 if shape and shape[0] == 0 else 0)

    def _batched(self, name: str) -> bool:
        shape = self.descs[name].shape
        return bool(shape) and shape[0] == 0

    def _node(self, p: Path, node: Node) -> None:
        outs = list(node.outputs)
        if not any(i in self.layout for i in node.inputs):
            p.op(node.op, *node.inputs, outputs=outs, **node.attrs)
            return
        rule = get_op(node.op).stacking
        if not isinstance(rule, StackRule):
            raise StackError(f"op {node.op} (computing {', '.join(outs)}) has no stacking "
                             "rule: train these models one by one")
        _RULES[rule](self, p, node)

    def _elementwise(self, p: Path, node: Node) -> None:
        p.op(node.op, *node.inputs, outputs=list(node.outputs), **node.attrs)
        lay = self.layout[node.inputs[0]]
        for o in node.outputs:
            self.layout[o] = lay

    def _broadcasting(self, p: Path, node: Node) -> None:
        p.op(node.op, *node.inputs, outputs=list(node.outputs), **node.attrs)
        self.layout[node.outputs[0]] = self._broadcast(node)

    def _metric(self, p: Path, node: Node) -> None:
        self._scores(node, node.inputs[0])
        p.op(node.op, *node.inputs, outputs=list(node.outputs), **node.attrs)
        self.layout[node.outputs[0]] = _Layout(1, batched=False)

    def _dense(self, p: Path, node: Node) -> None:
        attrs = get_op(node.op).with_defaults(node.attrs)
        a, w = node.inputs[:2]
        where = f"{node.op} computing {node.outputs[0]}"
        if w not in self.params or (a in self.layout and not self.layout[a].batched):
            raise StackError(f"{where}: only a product of data by a weight parameter "
                             "stacks")
        if len(self.descs[w].shape) != 2 or self._rank(a) != 1 or not self._batched(a):
            raise StackError(f"{where}: only [batch, in] x [in, out] products stack")
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or \
                attrs.get("beta", 1.0) != 1.0:
            raise StackError(f"{where}: transA, alpha and beta do not stack")
        tb = int(attrs.get("transB", 0))
        n_out = self.descs[w].shape[0 if tb else 1]
        form = {"transB": int(tb and w not in self.transposed),
                "model_axis": int(w in self.interleaved)}
        c = node.inputs[2] if len(node.inputs) == 3 else None
        outs = list(node.outputs)
        if c is None:
            p.op("StackedGemm", a, w, outputs=outs, **form)
        elif c in self.params and self.descs[c].shape == (n_out,):
            p.op("StackedGemm", a, w, c, outputs=outs, **form)
        else:  # a bias the models share, or of another shape: added after
            y = p.op("StackedGemm", a, w, **form)
            self.layout[y.name] = _Layout(2, batched=True)
            p.op("Add", y, c, outputs=outs)
            self.layout[outs[0]] = self._broadcast(Node("Add", (y.name, c), tuple(outs)))
            return
        self.layout[outs[0]] = _Layout(2, batched=True)

    def _broadcast(self, node: Node) -> _Layout:
        """The layout of an elementwise result, if the model axes line up."""
        stacked = [self.layout[i] for i in node.inputs if i in self.layout]
        kpos = stacked[0].kpos
        where = f"{node.op} computing {node.outputs[0]}"
        if any(s.kpos != kpos for s in stacked):
            raise StackError(f"{where}: its stacked operands' model axes do not line up "
                             "(operands of different ranks)")
        for i in node.inputs:
            if i in self.layout:
                continue
            shape = self.descs[i].shape
            if self._batched(i):
                raise StackError(f"{where}: {i!r} is per-sample data the models share; "
                                 "its batch axis would meet the model axis")
            if len(shape) >= kpos and shape[len(shape) - kpos] != 1:
                raise StackError(f"{where}: {i!r} {shape} reaches the model axis")
        return _Layout(kpos, batched=any(s.batched for s in stacked))

    def _scores(self, node: Node, scores: str) -> None:
        lay = self.layout.get(scores)
        if lay is None or not lay.batched or lay.kpos != 2:
            raise StackError(f"{node.op} computing {node.outputs[0]}: scores must be "
                             "[batch, classes] per model")
        if any(i in self.layout for i in node.inputs[1:]):
            raise StackError(f"{node.op} computing {node.outputs[0]}: its labels must be "
                             "data the models share")

    def _loss(self, p: Path, node: Node) -> None:
        self._scores(node, node.inputs[0])
        attrs = get_op(node.op).with_defaults(node.attrs)
        if len(node.inputs) != 2 or attrs.get("ignore_index") is not None or \
                attrs.get("reduction", "mean") not in ("mean", "sum"):
            raise StackError(f"SoftmaxCrossEntropyLoss computing {node.outputs[0]}: class "
                             "weights, ignore_index and reduction='none' do not stack")
        outs = list(node.outputs)
        p.op("StackedSoftmaxCrossEntropyLoss", *node.inputs, outputs=outs,
             reduction=attrs.get("reduction", "mean"))
        self.layout[outs[0]] = _Layout(1, batched=False)
        if len(outs) > 1:
            self.layout[outs[1]] = _Layout(2, batched=True)


# One rule per kind of op (OpDef.stacking); the ops say which kind they are.
_RULES = {
    StackRule.ELEMENTWISE: _Stacker._elementwise,
    StackRule.BROADCAST: _Stacker._broadcasting,
    StackRule.DENSE: _Stacker._dense,
    StackRule.LOSS: _Stacker._loss,
    StackRule.METRIC: _Stacker._metric,
}


def _leaves(g: CalcGraph) -> list[str]:
    read = {i for p in g.paths for n in p.nodes for i in n.inputs}
    return [o for p in g.paths for n in p.nodes for o in n.outputs if o not in read]


def _check_same(graphs: Sequence[CalcGraph]) -> None:
    first = graphs[0]
    for i, g in enumerate(graphs[1:], 1):
        if list(g.variables) != list(first.variables):
            raise StackError(f"graph {i} ({g.name!r}) declares other variables than graph 0")
        for name, v in g.variables.items():
            v0 = first.variables[name]
            if (v.kind, v.desc, v.regularization, v.trainable) != \
                    (v0.kind, v0.desc, v0.regularization, v0.trainable):
                raise StackError(f"graph {i} ({g.name!r}): variable {name!r} differs from "
                                 "graph 0's (only parameter inits may differ)")
        sig = [(p.name, p.mode, p.loss, p.nodes) for p in g.paths]
        if sig != [(p.name, p.mode, p.loss, p.nodes) for p in first.paths] or \
                g.outputs != first.outputs:
            raise StackError(f"graph {i} ({g.name!r}) has other paths, operators or "
                             "outputs than graph 0")
