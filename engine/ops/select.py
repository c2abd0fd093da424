"""Variadic elementwise ops and selection: ``Sum``, ``Max`` and ``Min`` (ONNX, any number
of broadcast inputs), ``Clip`` (bounds as attributes), ``Where``, ``ArgMax``, and their
gradients (a sum's goes to every input; a selection's goes where the value came from:
to the first of equal maxima, through Clip only inside its bounds, to the input the
condition chose)."""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import GraphError, ShapeError
from engine.graph import DType, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NON_DIFFERENTIABLE_METRIC,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    broadcast_shapes,
    per_input,
    per_output,
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm, attrs_as_inputs, inputs_as_attrs
from engine.ops.elementwise import unbroadcast


def _variadic_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    shape = ins[0].shape
    for d in ins[1:]:
        shape = broadcast_shapes(shape, d.shape)
    return [TensorDesc(dt, shape)]


def _variadic_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """n - 1 per output element for n inputs (one alone is a copy)."""
    return (len(ins) - 1) * outs[0].numel()


def _extremum(ufunc: str) -> Any:
    def factory(k: KernelArgs) -> Step:
        xp, y = k.xp, k.outs[0]
        f = getattr(xp, ufunc)
        first, *rest = k.ins

        def step() -> None:
            xp.copyto(y, first)
            for x in rest:
                f(y, x, out=y)

        return step

    return factory


def _g_extremum(which: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        if not g[0]:
            return [None] * len(n.inputs)
        if len(n.inputs) == 1:
            return [g[0]]
        if len(n.inputs) != 2:
            raise GraphError(f"the gradient of {n.op} over {len(n.inputs)} inputs is not "
                             "supported (two at most)")
        a, b = n.inputs
        return [unbroadcast(gb, gb.op("SelectGrad", a, b, g[0], pick=0, kind=which), a),
                unbroadcast(gb, gb.op("SelectGrad", a, b, g[0], pick=1, kind=which), b)]

    return rule


def _select_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [TensorDesc(ins[2].dtype, ins[2].shape)]


def _mask_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return align_up(outs[0].numel())


def _select_grad(k: KernelArgs) -> Step:
    """dY where input ``pick`` gave the extremum (the first input wins ties)."""
    xp, (a, b, dy), dx = k.xp, k.ins, k.outs[0]
    mask = k.scratch(0, dx.shape, "bool")
    ge, gt = (xp.greater_equal, xp.greater) if k.attrs["kind"] == "max" else \
        (xp.less_equal, xp.less)
    first = int(k.attrs["pick"]) == 0

    def step() -> None:
        if first:
            ge(a, b, out=mask)
        else:
            gt(b, a, out=mask)
        dx.fill(0)
        xp.copyto(dx, dy, where=mask)

    return step


def _clip_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[0]]


def _clip_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """1 per element; unbounded, a copy."""
    return 0 if attrs["min"] is None and attrs["max"] is None else outs[0].numel()


def _clip(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    lo, hi = k.attrs["min"], k.attrs["max"]
    if lo is None and hi is None:
        return lambda: xp.copyto(y, x)
    if lo is not None and hi is not None and lo > hi:
        return lambda: y.fill(hi)  # ONNX (and numpy): every value is max
    lo_v = lo if lo is not None else None
    return lambda: xp.clip(x, lo_v, hi, out=y)


def _g_clip(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("ClipGrad", n.inputs[0], g[0], **n.attrs)] if g[0] else [None]


def _clip_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    lo, hi = k.attrs["min"], k.attrs["max"]
    mask = k.scratch(0, dx.shape, "bool")
    inside = k.scratch(align_up(dx.size), dx.shape, "bool")

    def step() -> None:
        mask.fill(True)
        if lo is not None:
            xp.greater_equal(x, lo, out=inside)
            xp.logical_and(mask, inside, out=mask)
        if hi is not None:
            xp.less_equal(x, hi, out=inside)
            xp.logical_and(mask, inside, out=mask)
        dx.fill(0)
        xp.copyto(dx, dy, where=mask)

    return step


def _clip_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"ClipGrad: x {ins[0].shape} and dy {ins[1].shape} differ")
    return [ins[1]]


def _two_masks_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                  ) -> int:
    return 2 * align_up(outs[0].numel())


def _g_sum(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    return [unbroadcast(gb, g[0], x) for x in n.inputs]


OPS = [
    OpDef(name="Sum", shape=_variadic_shape, kernel=_extremum("add"), grad=_g_sum,
          flops=_variadic_flops,
          num_inputs=(1, 64), stacking=NOT_STACKED, onnx=OnnxForm(name="Sum"),
          doc="elementwise sum of its inputs, broadcasting"),
    OpDef(name="Max", shape=_variadic_shape, kernel=_extremum("maximum"), grad=_g_extremum("max"),
          flops=_variadic_flops,
          inplace=(0,), num_inputs=(1, 16), stacking=NOT_STACKED, onnx=OnnxForm(name="Max"),
          doc="elementwise maximum of its inputs, broadcasting"),
    OpDef(name="Min", shape=_variadic_shape, kernel=_extremum("minimum"), grad=_g_extremum("min"),
          flops=_variadic_flops,
          inplace=(0,), num_inputs=(1, 16), stacking=NOT_STACKED, onnx=OnnxForm(name="Min"),
          doc="elementwise minimum of its inputs, broadcasting"),
    OpDef(name="SelectGrad", shape=_select_grad_shape, kernel=_select_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(1),
          workspace=_mask_ws, num_inputs=(3, 3), attrs={"pick": 0, "kind": "max"},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dY where input `pick` gave the max (or min)"),
    OpDef(name="Clip", shape=_clip_shape, kernel=_clip, grad=_g_clip, inplace=(0,),
          flops=_clip_flops,
          attrs={"min": None, "max": None}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Clip", export=attrs_as_inputs("min", "max", floats=("min", "max")),
                        import_=inputs_as_attrs("min", "max"), attr_inputs=(1, 2)),
          doc="ONNX Clip with its bounds as attributes (None: unbounded)"),
    OpDef(name="ClipGrad", shape=_clip_grad_shape, kernel=_clip_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(1),
          workspace=_two_masks_ws, num_inputs=(2, 2), attrs={"min": None, "max": None},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dY where min <= x <= max"),
]


def _where_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    cond, x, y = ins
    if cond.dtype.value != "bool":
        raise ShapeError(f"Where's condition must be bool, got {cond.dtype.value}")
    dt = same_dtype([x, y], "Where's values")
    return [TensorDesc(dt, broadcast_shapes(cond.shape, broadcast_shapes(x.shape, y.shape)))]


def _where(k: KernelArgs) -> Step:
    xp, (cond, x, y), out = k.xp, k.ins, k.outs[0]

    def step() -> None:  # masked copies (np.where would allocate its result)
        xp.copyto(out, y)
        xp.copyto(out, x, where=cond)

    return step


def _g_where(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None, None]
    cond, x, y = n.inputs
    return [None,
            unbroadcast(gb, gb.op("WhereGrad", cond, g[0], pick=0), x),
            unbroadcast(gb, gb.op("WhereGrad", cond, g[0], pick=1), y)]


def _where_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _where_grad(k: KernelArgs) -> Step:
    """dY where the condition chose this input (pick 0: true, 1: false)."""
    xp, (cond, dy), dx = k.xp, k.ins, k.outs[0]
    mask = k.scratch(0, dx.shape, "bool")
    first = int(k.attrs["pick"]) == 0

    def step() -> None:
        if first:
            xp.copyto(mask, cond)
        else:
            xp.logical_not(cond, out=mask)
        dx.fill(0)
        xp.copyto(dx, dy, where=mask)

    return step


def _argmax_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    axis = int(attrs["axis"]) % max(len(src), 1)
    if ins[0].batched and axis == 0:
        raise ShapeError("ArgMax along the batch axis is not supported")
    shape = tuple(1 if i == axis else d for i, d in enumerate(src)) if attrs["keepdims"] \
        else tuple(d for i, d in enumerate(src) if i != axis)
    return [TensorDesc(DType.INT64, shape)]


def _argmax(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axis = int(k.attrs["axis"]) % x.ndim
    out = y.reshape(tuple(d for i, d in enumerate(x.shape) if i != axis))
    if not k.attrs["select_last_index"]:
        return lambda: xp.argmax(x, axis=axis, out=out)
    flipped = xp.flip(x, axis=axis)
    last = x.shape[axis] - 1

    def step() -> None:  # the last maximum: the first of the reversed axis, mapped back
        xp.argmax(flipped, axis=axis, out=out)
        xp.subtract(last, out, out=out)

    return step


OPS += [
    OpDef(name="Where", shape=_where_shape, kernel=_where, grad=_g_where, num_inputs=(3, 3),
          flops=per_output(1),
          stacking=StackRule.BROADCAST, onnx=OnnxForm(name="Where"),
          doc="ONNX Where: x where the condition holds, else y (broadcasting)"),
    OpDef(name="WhereGrad", shape=_where_grad_shape, kernel=_where_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(1),
          workspace=_mask_ws, num_inputs=(2, 2), attrs={"pick": 0}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL, doc="internal: dY where the condition chose the input"),
    OpDef(name="ArgMax", shape=_argmax_shape, kernel=_argmax, grad=NON_DIFFERENTIABLE_METRIC,
          flops=per_input(1),
          attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="ArgMax"), doc="ONNX ArgMax (int64 indices)"),
]
