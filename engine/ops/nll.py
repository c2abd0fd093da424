"""``NegativeLogLikelihoodLoss`` and the general form of ``SoftmaxCrossEntropyLoss``
(ONNX): scores ``[N, C, d1, ...]``, integer targets ``[N, d1, ...]``, optional class
weights ``[C]``, ``ignore_index``, and reduction ``none``, ``sum`` or ``mean`` (the
weighted mean: divided by the summed weights of the targets not ignored).

Every target position ``(n, r)`` (``r`` running over ``d1, ...``) reads one entry of
the scores, at the flat index ``(n * C + t) * R + r``; the kernels build those indices
in the workspace with same-shape calls, and reach the entries with ``take`` and
``put`` (no fancy indexing, which would allocate).  Ignored positions read class 0
and get weight 0.  ``loss.py`` keeps the fast kernels of the common case (2-D scores,
no weights, nothing ignored, a reduced loss); this module does the rest.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (2, 3)); t = g.placeholder("t", (2,), dtype="int64")
>>> y = g.path("l", Mode.FORWARD_ONLY).NegativeLogLikelihoodLoss(x, t, reduction="none",
...                                                                ignore_index=1)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
>>> vm.set("x", np.array([[-1, -2, -3], [-4, -5, -6]], np.float32))
>>> vm.set("t", np.array([2, 1])); vm.forward("l"); vm.get(y.name).tolist()
[3.0, 0.0]
"""

from __future__ import annotations

import math
from typing import Any

from engine.alignment import align_up
from engine.errors import InputError, ShapeError
from engine.graph import DType, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    is_numpy,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm
from engine.ops.reduce import SOFTMAX_FLOPS, log_softmax_step

REDUCTIONS = ("none", "sum", "mean")


def nll_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """1 per target position (the picked score summed, or negated), and 1 more with
    class weights."""
    return ins[1].numel() * (1 + (len(ins) == 3))


def nll_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                   ) -> int:
    """1 per target position (dloss placed at the target), and 1 more with class
    weights."""
    return ins[2].numel() * (1 + (len(ins) == 4))


def sce_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The log-softmax's 5 per score, and :func:`nll_flops`."""
    return SOFTMAX_FLOPS * ins[0].numel() + nll_flops(ins, outs, attrs)


def sce_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                   ) -> int:
    """exp(log_prob) and the scale by dloss, 2 per score; the one-hot subtracted 1 per
    target position, and 1 more with class weights."""
    return 2 * ins[1].numel() + ins[2].numel() * (1 + (len(ins) == 4))


def check(ins: list[TensorDesc], attrs: dict[str, Any], op: str) -> TensorDesc:
    """The loss output's descriptor, after checking scores, targets and weights."""
    x, t = ins[0], ins[1]
    if not x.dtype.is_float:
        raise ShapeError(f"{op}: scores must be float, got {x.dtype.value}")
    if len(x.shape) < 2:
        raise ShapeError(f"{op}: scores must be [N, C, ...], got {x.shape}")
    if t.dtype not in (DType.INT64, DType.INT32):
        raise ShapeError(f"{op}: targets must be int64 or int32, got {t.dtype.value}")
    if t.shape != (x.shape[0], *x.shape[2:]):
        raise ShapeError(f"{op}: targets {t.shape} do not match scores {x.shape} (expected "
                         f"{(x.shape[0], *x.shape[2:])})")
    if len(ins) > 2 and (ins[2].shape != (x.shape[1],) or ins[2].dtype != x.dtype):
        raise ShapeError(f"{op}: weights must be [{x.shape[1]}] {x.dtype.value}, got "
                         f"{ins[2].shape} {ins[2].dtype.value}")
    if attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"{op}: reduction {attrs['reduction']!r} is not one of "
                         f"{', '.join(REDUCTIONS)}")
    return TensorDesc(x.dtype, t.shape if attrs["reduction"] == "none" else ())


def _positions(x: TensorDesc) -> int:
    return x.shape[0] * math.prod(x.shape[2:])


def ws_bytes(x: TensorDesc) -> int:
    """Targets made safe, flat indices, a scratch (int64 each), weights and values."""
    p = _positions(x)
    return 3 * align_up(8 * p) + 2 * align_up(p * x.dtype.itemsize) + align_up(x.dtype.itemsize)


class Picks:
    """Per target position: its flat index into the scores and its weight (0 where
    ignored), built in the workspace at the start of each step."""

    def __init__(self, k: KernelArgs, scores: Any, targets: Any, weights: Any | None,
                 at: int = 0) -> None:
        self.xp = k.xp
        n, c = scores.shape[0], scores.shape[1]
        r = math.prod(scores.shape[2:])
        p = n * r
        self.c, self.r = c, r
        self.targets = targets.reshape(p)
        self.safe = k.scratch(at, (p,), "int64")
        self.idx = k.scratch(at + align_up(8 * p), (p,), "int64")
        self.tmp = k.scratch(at + 2 * align_up(8 * p), (p,), "int64")
        o = at + 3 * align_up(8 * p)
        self.w = k.scratch(o, (p,), scores.dtype)
        self.vals = k.scratch(o + align_up(p * scores.dtype.itemsize), (p,), scores.dtype)
        self.total = k.scratch(o + 2 * align_up(p * scores.dtype.itemsize), (), scores.dtype)
        self.weights = weights
        ignore = k.attrs.get("ignore_index")
        self.ignore = None if ignore is None else int(ignore)
        self.unsigned = self.safe.view("uint64")
        self.mask = self.tmp.view("bool")[:p] if p else None  # tmp's bytes, used first

    def build(self) -> None:
        xp, p = self.xp, self.safe.size
        xp.copyto(self.safe, self.targets, casting="unsafe")
        if self.ignore is not None:
            assert self.mask is not None
            xp.equal(self.safe, self.ignore, out=self.mask)
            xp.copyto(self.safe, 0, where=self.mask)
            if self.weights is None:
                self.w.fill(1)
            else:
                self.take(self.weights, self.safe, self.w)
            xp.copyto(self.w, 0, where=self.mask)
        elif self.weights is None:
            self.w.fill(1)
        else:
            self.take(self.weights, self.safe, self.w)
        if p and int(self.unsigned.max()) >= self.c:  # negative ones are huge unsigned
            raise InputError(f"targets must lie in [0, {self.c}) (or be ignore_index "
                             f"{self.ignore}); got values in [{int(self.targets.min())}, "
                             f"{int(self.targets.max())}]")
        # idx = (n * C + t) * R + r = q + n * (C - 1) * R + t * R, with q = n * R + r
        self.idx.fill(1)
        if p:
            self.idx[0] = 0
        xp.cumsum(self.idx, out=self.idx)
        xp.floor_divide(self.idx, self.r, out=self.tmp)
        xp.multiply(self.tmp, (self.c - 1) * self.r, out=self.tmp)
        xp.add(self.idx, self.tmp, out=self.idx)
        xp.multiply(self.safe, self.r, out=self.tmp)
        xp.add(self.idx, self.tmp, out=self.idx)

    def take(self, src: Any, idx: Any, out: Any) -> None:
        if is_numpy(self.xp):
            self.xp.take(src, idx, out=out, mode="clip")
        else:
            self.xp.take(src, idx, out=out)

    def pick(self, scores: Any) -> None:
        """vals = scores at the target entries."""
        self.take(scores.reshape(-1), self.idx, self.vals)

    def scale(self, reduction: str, dy: Any) -> Any:
        """The upstream gradient per position, times its weight, into ``vals``."""
        xp = self.xp
        if reduction == "none":
            xp.multiply(self.w, dy.reshape(-1), out=self.vals)
            return self.vals
        factor = float(dy)
        if reduction == "mean":
            xp.sum(self.w, out=self.total)
            factor /= float(self.total)
        xp.multiply(self.w, factor, out=self.vals)
        return self.vals


def reduce_step(xp: Any, picks: Picks, reduction: str, out: Any) -> None:
    """out = -(picked scores * weights), reduced."""
    xp.multiply(picks.vals, picks.w, out=picks.vals)
    xp.negative(picks.vals, out=picks.vals)
    if reduction == "none":
        xp.copyto(out.reshape(-1), picks.vals)
        return
    xp.sum(picks.vals, out=out)
    if reduction == "mean":
        xp.sum(picks.w, out=picks.total)
        xp.divide(out, picks.total, out=out)


# -- NegativeLogLikelihoodLoss ---------------------------------------------------------------


def _nll_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [check(ins, attrs, "NegativeLogLikelihoodLoss")]


def _nll_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ws_bytes(ins[0])


def _nll(k: KernelArgs) -> Step:
    xp, x, t = k.xp, k.ins[0], k.ins[1]
    picks = Picks(k, x, t, k.ins[2] if len(k.ins) > 2 else None)
    reduction, out = k.attrs["reduction"], k.outs[0]

    def step() -> None:
        picks.build()
        picks.pick(x)
        reduce_step(xp, picks, reduction, out)

    return step


def _g_nll(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    return [gb.op("NegativeLogLikelihoodLossGrad", g[0], *n.inputs, **n.attrs),
            *([None] * (len(n.inputs) - 1))]


def _grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ws_bytes(ins[1])


def _nll_grad(k: KernelArgs) -> Step:
    """dX is zero but at the target entries: -dY * weight (over the summed weights for
    a mean)."""
    xp, (dy, x, t), dx = k.xp, k.ins[:3], k.outs[0]
    picks = Picks(k, x, t, k.ins[3] if len(k.ins) > 3 else None)
    flat, reduction = dx.reshape(-1), k.attrs["reduction"]
    numpy = is_numpy(xp)

    def step() -> None:
        picks.build()
        coef = picks.scale(reduction, dy)
        xp.negative(coef, out=coef)
        dx.fill(0)
        if numpy:
            xp.put(flat, picks.idx, coef, mode="clip")
        else:
            xp.put(flat, picks.idx, coef)

    return step


# -- SoftmaxCrossEntropyLoss, general ---------------------------------------------------------


def sce_ws(x: TensorDesc) -> int:
    """A row of maxima/sums and an exp scratch for the log-softmax, then the picks."""
    row = x.numel() // max(x.shape[1], 1)
    return align_up(row * x.dtype.itemsize) + align_up(x.nbytes()) + ws_bytes(x)


def sce_kernel(k: KernelArgs) -> Step:
    xp, x, t = k.xp, k.ins[0], k.ins[1]
    loss, logp = k.outs[0], k.outs[1]
    row = (x.shape[0], 1, *x.shape[2:])
    s = k.scratch(0, row, x.dtype)
    at = align_up(math.prod(row) * x.dtype.itemsize)
    e = k.scratch(at, x.shape, x.dtype)
    lsm = log_softmax_step(xp, x, logp, s, e, 1)
    picks = Picks(k, x, t, k.ins[2] if len(k.ins) > 2 else None, at + align_up(x.nbytes))
    reduction = k.attrs["reduction"]

    def step() -> None:
        lsm()
        picks.build()
        picks.pick(logp)
        reduce_step(xp, picks, reduction, loss)

    return step


def sce_grad_kernel(k: KernelArgs) -> Step:
    """dX = coef * (softmax - onehot(target)), coef the weighted upstream gradient of
    each target position, broadcast over the classes."""
    xp, (dy, logp, t), dx = k.xp, k.ins[:3], k.outs[0]
    picks = Picks(k, logp, t, k.ins[3] if len(k.ins) > 3 else None)
    flat, reduction = dx.reshape(-1), k.attrs["reduction"]
    n, c = logp.shape[0], logp.shape[1]
    r = math.prod(logp.shape[2:])
    dx3 = dx.reshape(n, c, r)
    numpy = is_numpy(xp)
    at_targets = picks.tmp.view(dx.dtype)[:n * r]

    def step() -> None:
        picks.build()
        coef = picks.scale(reduction, dy)  # [n * r]
        xp.exp(logp, out=dx)
        xp.multiply(dx3, coef.reshape(n, 1, r), out=dx3)
        # at the targets, minus coef: read, subtract, write back
        vals = at_targets  # the int64 scratch's bytes, free once the indices are built
        picks.take(flat, picks.idx, vals)
        xp.subtract(vals, coef, out=vals)
        if numpy:
            xp.put(flat, picks.idx, vals, mode="clip")
        else:
            xp.put(flat, picks.idx, vals)

    return step


OPS = [
    OpDef(name="NegativeLogLikelihoodLoss", shape=_nll_shape, kernel=_nll, grad=_g_nll,
          flops=nll_flops,
          workspace=_nll_ws, num_inputs=(2, 3), attrs={"reduction": "mean", "ignore_index": None},
          stacking=NOT_STACKED, onnx=OnnxForm(name="NegativeLogLikelihoodLoss"),
          doc="ONNX NegativeLogLikelihoodLoss: -input[n, target, ...] * weight, reduced"),
    OpDef(name="NegativeLogLikelihoodLossGrad", shape=_grad_shape, kernel=_nll_grad,
          flops=nll_grad_flops,
          grad=FIRST_ORDER_ONLY, workspace=_grad_ws, num_inputs=(3, 4),
          attrs={"reduction": "mean", "ignore_index": None}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL, doc="internal: dX of NegativeLogLikelihoodLoss"),
]
