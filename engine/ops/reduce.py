"""Reductions and normalisations over an axis: ``ReduceSum``, ``ReduceMean``,
``Softmax``, ``LogSoftmax``, ``Hardmax`` and their gradient ops.

``axes`` is an attribute here (ONNX opset 13+ passes it as a constant input; the ONNX
importer folds it into the attribute).  Factors that depend on the batch size (the
``1/n`` of a mean over the batch) are computed when the kernel is bound, from the
runtime shape, so a smaller last mini-batch is exact.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from engine.alignment import align_up
from engine.errors import GraphError
from engine.graph import Node, TensorDesc
from engine.ops import jit
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    Variant,
    need_float,
    no_workspace,
    norm_axis,
    per_input,
    per_output,
)
from engine.ops._onnx import (
    ENGINE_INTERNAL,
    Exported,
    ImportContext,
    OnnxForm,
    import_axes,
    onnx_attrs,
)
from engine.ops.elementwise import grad_like_second


def reduce_axes(rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
    axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        if attrs.get("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    out = tuple(sorted({norm_axis(int(a), rank) for a in axes}))
    return out


def _reduce_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    shape = ins[0].shape
    axes = reduce_axes(len(shape), attrs)
    if attrs["keepdims"]:
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return [TensorDesc(ins[0].dtype, out)]


def reduce_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """1 per input element (a mean's final division is not counted); no axes
    (``noop_with_empty_axes``), a copy."""
    return ins[0].numel() if reduce_axes(len(ins[0].shape), attrs) else 0


def _reduce_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                       ) -> int:
    """A sum's gradient is broadcast (data movement); a mean's scales 1 per element."""
    return outs[0].numel() if attrs["mean"] else 0


SOFTMAX_FLOPS = 5
"""Per element of softmax and log-softmax: the row's max, the subtraction, exp, the
row's sum, and the division (softmax) or subtraction of its log (log-softmax)."""
SOFTMAX_GRAD_FLOPS = 4
"""Per element of their gradients: ``y·(dy - sum(dy·y))`` and ``dy - exp(y)·sum(dy)``."""


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _reduce_kernel(mean: bool) -> Any:
    def factory(k: KernelArgs) -> Step:
        xp, x, y = k.xp, k.ins[0], k.outs[0]
        axes = reduce_axes(x.ndim, k.attrs)
        keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        y_kept = y.reshape(keep)
        if not axes:
            return lambda: xp.copyto(y, x)
        if not mean:
            return lambda: xp.sum(x, axis=axes, keepdims=True, out=y_kept)
        inv = 1.0 / max(_count(x.shape, axes), 1)

        def step() -> None:
            xp.sum(x, axis=axes, keepdims=True, out=y_kept)
            xp.multiply(y_kept, inv, out=y_kept)

        return step

    return factory


def _around_kept_block(shape: tuple[int, ...], attrs: dict[str, Any]
                       ) -> tuple[int, int, int] | None:
    """``shape`` as ``[A, B, C]``, where the reduced axes are the ones before (A) and
    after (C, more than one element) one block of kept axes (B): the compiled
    reduction's case.  None otherwise: leading axes alone keep SumTo's row-by-row
    order, which is numpy's own; every axis, or kept axes apart, stay numpy's."""
    axes = reduce_axes(len(shape), attrs)
    kept = [i for i in range(len(shape)) if i not in axes]
    if not axes or not kept or kept != list(range(kept[0], kept[-1] + 1)):
        return None
    a = b = c = 1
    for i, d in enumerate(shape):
        if i < kept[0]:
            a *= d
        elif i <= kept[-1]:
            b *= d
        else:
            c *= d
    return (a, b, c) if c > 1 else None


def _reduce_fused(mean: bool) -> Any:
    def factory(k: KernelArgs, ks: Any) -> Step | None:
        x, y = k.ins[0], k.outs[0]
        abc = _around_kept_block(tuple(x.shape), k.attrs)
        if abc is None or not x.flags.c_contiguous or not y.flags.c_contiguous or \
                x.dtype != y.dtype or x.dtype not in (np.float32, np.float64):
            return None
        x3, y1 = x.reshape(abc), y.reshape(-1)
        scale = x.dtype.type(1.0 / max(abc[0] * abc[2], 1) if mean else 1)
        run = ks.outer_inner_sums
        return lambda: run(x3, y1, scale)

    return factory


def _fused_applies(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                   ) -> bool:
    """Where the compiled reduction differs from numpy's: float axes around a kept
    block (:func:`_around_kept_block`)."""
    return _around_kept_block(tuple(ins[0].shape), attrs) is not None and \
        ins[0].dtype in ("float32", "float64")


def _reduce_variants(mean: bool) -> dict[str, Variant]:
    table = jit.variants(_reduce_kernel(mean), _reduce_fused(mean), no_workspace,
                         f"the axes around a kept block {'averaged' if mean else 'summed'} "
                         f"in one compiled loop")
    return {**table, "numba": replace(table["numba"], applies=_fused_applies)}


REDUCE_SUM = _reduce_variants(mean=False)
REDUCE_MEAN = _reduce_variants(mean=True)


def _g_reduce(mean: bool) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        if not g[0]:
            return [None]
        return [gb.op("ReduceGrad", g[0], n.inputs[0], axes=reduce_axes(
            len(gb.desc(n.inputs[0]).shape), n.attrs), keepdims=n.attrs["keepdims"],
            mean=int(mean))]

    return rule


def _reduce_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [TensorDesc(ins[0].dtype, ins[1].shape)]


def _reduce_grad(k: KernelArgs) -> Step:
    xp, dy, dx = k.xp, k.ins[0], k.outs[0]
    axes = tuple(k.attrs["axes"])
    keep = tuple(1 if i in axes else d for i, d in enumerate(dx.shape))
    dy_kept = dy.reshape(keep)
    if not k.attrs["mean"]:
        return lambda: xp.copyto(dx, dy_kept)
    inv = 1.0 / max(_count(dx.shape, axes), 1)
    return lambda: xp.multiply(dy_kept, inv, out=dx)


def _g_reduce_grad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    op = "ReduceMean" if n.attrs["mean"] else "ReduceSum"
    return [gb.op(op, g[0], axes=tuple(n.attrs["axes"]), keepdims=n.attrs["keepdims"]), None]


def _softmax_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    norm_axis(int(attrs["axis"]), len(ins[0].shape))
    return [ins[-1]]


def _row_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(1 if i == axis else d for i, d in enumerate(shape))


def _row_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    d = ins[-1]
    axis = norm_axis(int(attrs["axis"]), len(d.shape))
    return TensorDesc(d.dtype, _row_shape(d.shape, axis)).nbytes()


def _logsoftmax_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return _row_ws(ins, outs, attrs, device) + ins[0].nbytes()


def _softmax(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), x.ndim)
    s = k.scratch(0, _row_shape(x.shape, axis), x.dtype)

    def step() -> None:
        xp.max(x, axis=axis, keepdims=True, out=s)
        xp.subtract(x, s, out=y)
        xp.exp(y, out=y)
        xp.sum(y, axis=axis, keepdims=True, out=s)
        xp.divide(y, s, out=y)

    return step


def log_softmax_step(xp: Any, x: Any, y: Any, s: Any, e: Any, axis: int) -> Step:
    """y = x - logsumexp(x) along ``axis``; ``s`` is a row scratch, ``e`` a full one."""

    def step() -> None:
        xp.max(x, axis=axis, keepdims=True, out=s)
        xp.subtract(x, s, out=y)
        xp.exp(y, out=e)
        xp.sum(e, axis=axis, keepdims=True, out=s)
        xp.log(s, out=s)
        xp.subtract(y, s, out=y)

    return step


def _log_softmax(k: KernelArgs) -> Step:
    x, y = k.ins[0], k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), x.ndim)
    row = _row_shape(x.shape, axis)
    s = k.scratch(0, row, x.dtype)
    e = k.scratch(_row_ws_bytes(row, x), x.shape, x.dtype)
    return log_softmax_step(k.xp, x, y, s, e, axis)


def _row_ws_bytes(row: tuple[int, ...], x: Any) -> int:
    n = 1
    for d in row:
        n *= d
    return n * x.dtype.itemsize


def _softmax_grad(k: KernelArgs) -> Step:
    xp, (y, dy), dx = k.xp, k.ins, k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), y.ndim)
    s = k.scratch(0, _row_shape(y.shape, axis), y.dtype)

    def step() -> None:
        xp.multiply(dy, y, out=dx)
        xp.sum(dx, axis=axis, keepdims=True, out=s)
        xp.subtract(dy, s, out=dx)
        xp.multiply(dx, y, out=dx)

    return step


def _log_softmax_grad(k: KernelArgs) -> Step:
    xp, (y, dy), dx = k.xp, k.ins, k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), y.ndim)
    s = k.scratch(0, _row_shape(y.shape, axis), y.dtype)

    def step() -> None:
        xp.sum(dy, axis=axis, keepdims=True, out=s)
        xp.exp(y, out=dx)
        xp.multiply(dx, s, out=dx)
        xp.subtract(dy, dx, out=dx)

    return step


def _g_softmax(grad_op: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        return [gb.op(grad_op, n.outputs[0], g[0], axis=n.attrs["axis"])] if g[0] else [None]

    return rule


_REDUCE_ATTRS = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}

def _hardmax_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                ) -> int:
    return align_up(_row_ws(ins, outs, attrs, device)) + 2 * align_up(ins[0].numel())


def _hardmax(k: KernelArgs) -> Step:
    """1 at the first maximum along ``axis``, 0 elsewhere: the cells equal to the
    maximum, of which a running count keeps the first (no index arrays)."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), x.ndim)
    row = _row_shape(x.shape, axis)
    m = k.scratch(0, row, x.dtype)
    at = align_up(_row_ws_bytes(row, x))
    top = k.scratch(at, x.shape, "bool")
    first = k.scratch(at + align_up(x.size), x.shape, "bool")

    def step() -> None:
        xp.max(x, axis=axis, keepdims=True, out=m)
        xp.equal(x, m, out=top)
        xp.copyto(y, top)
        xp.cumsum(y, axis=axis, out=y)  # how many maxima so far along the axis
        xp.equal(y, 1, out=first)
        xp.logical_and(first, top, out=first)
        xp.copyto(y, first)

    return step


def _g_hardmax(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [None]  # piecewise constant: the derivative is zero almost everywhere


# -- ONNX forms ------------------------------------------------------------------------


def _export_reduce_sum(n: Node, helper: Any, nh: Any) -> Exported:
    """ReduceSum takes its axes as an input from opset 13."""
    attrs = dict(n.attrs)
    axes = attrs.pop("axes", None)
    extra = []
    ins = [n.inputs[0]]
    if axes:
        t = nh.from_array(np.asarray(axes, dtype=np.int64), f"{n.outputs[0]}:axes")
        extra.append(t)
        ins.append(t.name)
    return [helper.make_node("ReduceSum", ins, list(n.outputs), **onnx_attrs(attrs))], extra


def _export_reduce_mean(n: Node, helper: Any, nh: Any) -> Exported:
    # noop_with_empty_axes is an opset-18 attribute of ReduceMean; 0 is what it did
    attrs = dict(n.attrs)
    if attrs.pop("noop_with_empty_axes", 0):
        raise GraphError(f"{n.op} with noop_with_empty_axes=1 has no opset-17 form")
    return [helper.make_node(n.op, list(n.inputs), list(n.outputs), **onnx_attrs(attrs))], []


def _import_coerced(ctx: ImportContext, path: Any, node: Any, ins: list[str],
                    attrs: dict[str, Any]) -> bool:
    """Softmax before opset 13: the input is viewed as 2-D, ``[prod(dims[:axis]),
    prod(dims[axis:])]``, with ``axis`` 1 by default; as Flatten, Softmax, Reshape."""
    if ctx.opset >= 13:
        return False
    axis = int(attrs.get("axis", 1))
    shape = ctx.shapes.get(ins[0])
    if shape is None:
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}, opset < 13): "
                         f"the rank of {ins[0]!r} is unknown")
    axis %= max(len(shape), 1)
    if axis == len(shape) - 1:
        path.op(node.op_type, *ins, outputs=list(node.output), axis=axis)
        return True
    if 0 in shape[axis:]:
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}, opset < 13): "
                         f"the dimensions after axis {axis} of {shape} must be known")
    flat = path.Flatten(ins[0], axis=axis)
    soft = path.op(node.op_type, flat, axis=1)
    path.Reshape(soft, shape=(0,) * axis + tuple(shape[axis:]), outputs=list(node.output))
    return True


OPS = [
    OpDef(name="Hardmax", shape=_softmax_shape, kernel=_hardmax, grad=_g_hardmax,
          flops=per_input(1),
          workspace=_hardmax_ws, attrs={"axis": -1}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Hardmax", build=_import_coerced, needs_shapes=True),
          doc="ONNX Hardmax: 1 at the first maximum along axis, else 0"),
    OpDef(name="ReduceSum", shape=_reduce_shape, kernel=jit.by_size("ReduceSum", REDUCE_SUM),
          flops=reduce_flops,
          variants=REDUCE_SUM,
          grad=_g_reduce(False), attrs=dict(_REDUCE_ATTRS), stacking=NOT_STACKED,
          onnx=OnnxForm(name="ReduceSum", export=_export_reduce_sum, import_=import_axes,
                        attr_inputs=(1,)),
          doc="sum over axes (all by default)"),
    OpDef(name="ReduceMean", shape=_reduce_shape, kernel=jit.by_size("ReduceMean", REDUCE_MEAN),
          flops=reduce_flops,
          variants=REDUCE_MEAN,
          grad=_g_reduce(True), attrs=dict(_REDUCE_ATTRS), stacking=NOT_STACKED,
          onnx=OnnxForm(name="ReduceMean", export=_export_reduce_mean, import_=import_axes,
                        attr_inputs=(1,)),
          doc="mean over axes (all by default)"),
    OpDef(name="ReduceGrad", shape=_reduce_grad_shape, kernel=_reduce_grad, grad=_g_reduce_grad,
          flops=_reduce_grad_flops,
          num_inputs=(2, 2), attrs={"axes": (), "keepdims": 1, "mean": 0},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: broadcast a reduction's gradient back (input 1 gives the shape)"),
    OpDef(name="Softmax", shape=_softmax_shape, kernel=_softmax, grad=_g_softmax("SoftmaxGrad"),
          flops=per_output(SOFTMAX_FLOPS),
          inplace=(0,), workspace=_row_ws, attrs={"axis": -1}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Softmax", build=_import_coerced, needs_shapes=True),
          doc="exp(x) / sum(exp(x)) along axis"),
    OpDef(name="LogSoftmax", shape=_softmax_shape, kernel=_log_softmax,
          flops=per_output(SOFTMAX_FLOPS),
          grad=_g_softmax("LogSoftmaxGrad"), workspace=_logsoftmax_ws, attrs={"axis": -1},
          stacking=NOT_STACKED,
          onnx=OnnxForm(name="LogSoftmax", build=_import_coerced, needs_shapes=True),
          doc="x - log(sum(exp(x))) along axis"),
    OpDef(name="SoftmaxGrad", shape=grad_like_second, kernel=_softmax_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(SOFTMAX_GRAD_FLOPS),
          workspace=_row_ws, num_inputs=(2, 2), attrs={"axis": -1}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL, doc="internal: y * (dy - sum(dy * y))"),
    OpDef(name="LogSoftmaxGrad", shape=grad_like_second, kernel=_log_softmax_grad,
          flops=per_output(SOFTMAX_GRAD_FLOPS),
          grad=FIRST_ORDER_ONLY, workspace=_row_ws, num_inputs=(2, 2), attrs={"axis": -1},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy - exp(y) * sum(dy)"),
]
