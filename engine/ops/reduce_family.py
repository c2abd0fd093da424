"""The rest of ONNX's Reduce* family: ``ReduceMax``, ``ReduceMin``, ``ReduceProd``,
``ReduceL1``, ``ReduceL2``, ``ReduceLogSum``, ``ReduceLogSumExp`` and
``ReduceSumSquare``, with one gradient op for all of them.

They share ReduceSum's attributes (``axes``, ``keepdims``, ``noop_with_empty_axes``)
and shape rule.  Where a reduction needs a transformed copy of its input (squares,
absolute values, ``exp(x - max)``) the copy is workspace, so nothing is allocated.
Gradients, from the input ``x``, the output ``y`` and ``dY``:

- max and min: ``dY`` to every element equal to the extremum (ties all receive it);
- prod: ``dY * y / x`` (an input holding a zero gives a non-finite gradient);
- L1: ``dY * sign(x)``; L2: ``dY * x / y`` (0 where y is 0); sum of squares: ``2 x dY``;
- log-sum: ``dY * exp(-y)``; log-sum-exp: ``dY * exp(x - y)``.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (2, 3))
>>> y = g.path("r", Mode.FORWARD_ONLY).ReduceLogSumExp(x, axes=(1,), keepdims=0)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
>>> vm.set("x", np.log(np.array([[1, 2, 5], [1, 1, 2]], np.float32))); vm.forward("r")
>>> np.round(np.exp(vm.get(y.name)), 4).tolist()
[8.0, 4.0]
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm, import_axes
from engine.ops.reduce import _reduce_shape, reduce_axes

KINDS = ("max", "min", "prod", "l1", "l2", "log_sum", "log_sum_exp", "sum_square")
NAMES = {"max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd", "l1": "ReduceL1",
         "l2": "ReduceL2", "log_sum": "ReduceLogSum", "log_sum_exp": "ReduceLogSumExp",
         "sum_square": "ReduceSumSquare"}
NEEDS_COPY = {"l1", "l2", "log_sum_exp", "sum_square"}  # reduce a transformed input
ATTRS = {"axes": (), "keepdims": 1, "noop_with_empty_axes": 0}


FLOPS = {"max": 1, "min": 1, "prod": 1, "l1": 2, "l2": 2, "log_sum": 1, "log_sum_exp": 4,
         "sum_square": 2}
"""Per input element: the reduction's 1, and the transform it reduces (an absolute value
or a square 1, log-sum-exp's max, subtraction and exp 3)."""
GRAD_FLOPS = {"max": 1, "min": 1, "prod": 2, "l1": 2, "l2": 2, "log_sum": 2,
              "log_sum_exp": 3, "sum_square": 2}
"""Per input element of the gradient (the module's docstring gives the formulas): the
extremum's dY routed by a mask 1, ``dY·exp(x - y)`` 3, the others 2."""


def _flops(kind: str) -> Any:
    def rule(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
        if not reduce_axes(len(ins[0].shape), attrs):  # noop_with_empty_axes: elementwise
            return 0 if kind in ("max", "min", "prod") else ins[0].numel()
        return FLOPS[kind] * ins[0].numel()

    return rule


def _grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    return GRAD_FLOPS[attrs["kind"]] * outs[0].numel()


def _kept(x: Any, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _shape(kind: str) -> Any:
    def rule(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
        if kind != "max" and kind != "min" and not ins[0].dtype.is_float:
            raise ShapeError(f"{NAMES[kind]} needs a float input, got {ins[0].dtype.value}")
        return _reduce_shape(ins, attrs)

    return rule


def _ws(kind: str) -> Any:
    def rule(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
        return align_up(ins[0].nbytes()) + align_up(outs[0].nbytes()) if kind in NEEDS_COPY else 0

    return rule


def _kernel(kind: str) -> Any:
    def factory(k: KernelArgs) -> Step:
        xp, x, y = k.xp, k.ins[0], k.outs[0]
        axes = reduce_axes(x.ndim, k.attrs)
        if not axes:  # noop_with_empty_axes: the input, transformed as the op would
            axes = ()
        yk = y.reshape(_kept(x, axes))
        t = k.scratch(0, x.shape, x.dtype) if kind in NEEDS_COPY else None
        m = k.scratch(align_up(x.nbytes), yk.shape, x.dtype) if kind in NEEDS_COPY else None
        # the array functions (cupy has them; ufunc.reduce is numpy's)
        reduce = {"max": xp.max, "min": xp.min, "prod": xp.prod}.get(kind, xp.sum)

        def step() -> None:
            if kind == "l1":
                xp.absolute(x, out=t)
            elif kind in ("l2", "sum_square"):
                xp.multiply(x, x, out=t)
            elif kind == "log_sum_exp":
                xp.max(x, axis=axes, keepdims=True, out=m)
                xp.subtract(x, m, out=t)
                xp.exp(t, out=t)
            src = t if t is not None else x
            if axes:
                reduce(src, axis=axes, keepdims=True, out=yk)
            else:
                xp.copyto(yk, src)
            if kind == "l2":
                xp.sqrt(yk, out=yk)
            elif kind in ("log_sum", "log_sum_exp"):
                xp.log(yk, out=yk)
                if kind == "log_sum_exp":
                    xp.add(yk, m, out=yk)

        return step

    return factory


def _grad(kind: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        if not g[0]:
            return [None]
        axes = reduce_axes(len(gb.desc(n.inputs[0]).shape), n.attrs)
        return [gb.op("ReduceFamilyGrad", g[0], n.inputs[0], n.outputs[0], kind=kind,
                      axes=axes)]

    return rule


def _grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return align_up(ins[1].numel()) if attrs["kind"] in ("max", "min", "l2") else 0


def _grad_kernel(k: KernelArgs) -> Step:
    xp, (dy, x, y), dx = k.xp, k.ins, k.outs[0]
    kind, axes = k.attrs["kind"], tuple(k.attrs["axes"])
    keep = _kept(x, axes)
    dyk, yk = dy.reshape(keep), y.reshape(keep)
    mask = k.scratch(0, x.shape, "bool") if kind in ("max", "min", "l2") else None

    def step() -> None:
        if kind in ("max", "min"):
            xp.equal(x, yk, out=mask)
            dx.fill(0)
            xp.copyto(dx, xp.broadcast_to(dyk, dx.shape), where=mask)
        elif kind == "prod":
            xp.divide(yk, x, out=dx)
            xp.multiply(dx, dyk, out=dx)
        elif kind == "l1":
            xp.sign(x, out=dx)
            xp.multiply(dx, dyk, out=dx)
        elif kind == "l2":
            xp.divide(x, yk, out=dx)
            xp.multiply(dx, dyk, out=dx)
            xp.equal(xp.broadcast_to(yk, dx.shape), 0, out=mask)
            xp.copyto(dx, 0.0, where=mask)
        elif kind == "sum_square":
            xp.multiply(x, dyk, out=dx)
            xp.multiply(dx, 2.0, out=dx)
        elif kind == "log_sum":
            xp.copyto(dx, xp.broadcast_to(yk, dx.shape))
            xp.negative(dx, out=dx)
            xp.exp(dx, out=dx)  # 1 / sum
            xp.multiply(dx, dyk, out=dx)
        else:  # log_sum_exp
            xp.subtract(x, yk, out=dx)
            xp.exp(dx, out=dx)
            xp.multiply(dx, dyk, out=dx)

    return step


OPS = [
    OpDef(name=NAMES[kind], shape=_shape(kind), kernel=_kernel(kind), grad=_grad(kind),
          flops=_flops(kind),
          workspace=_ws(kind), attrs=ATTRS, stacking=NOT_STACKED,
          onnx=OnnxForm(name=NAMES[kind], import_=import_axes, attr_inputs=(1,)),
          doc=f"ONNX {NAMES[kind]} over `axes` (all by default)")
    for kind in KINDS
] + [
    OpDef(name="ReduceFamilyGrad", shape=_grad_shape, kernel=_grad_kernel, grad=FIRST_ORDER_ONLY,
          flops=_grad_flops,
          workspace=_grad_ws, num_inputs=(3, 3), attrs={"kind": "max", "axes": ()},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX of a Reduce* op from dY, X and Y"),
]
