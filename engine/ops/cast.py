"""Element type conversions: ONNX ``Cast`` and ``DequantizeLinear``.

``DequantizeLinear`` is how compact data enters a model: a data set of 8-bit pixels is
kept (and shared between workers, and copied per mini-batch) at a quarter of the bytes
of float32, and the graph turns it into floats, ``(x - zero_point) * scale``.

Both kernels convert with ``copyto`` (an unbuffered, element-by-element cast) and then
work in place on the output, because a ufunc whose input and output types differ
casts through an internal buffer that is allocated on every call.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 3), dtype="uint8")
>>> y = g.path("infer", Mode.FORWARD_ONLY).DequantizeLinear(x, scale=0.5, zero_point=2)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
>>> vm.set("x", np.array([[0, 2, 255]], dtype=np.uint8)); vm.forward("infer")
>>> vm.get(y.name).tolist()
[[-1.0, 0.0, 126.5]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.graph import DType, Node, TensorDesc
from engine.ops._base import (
    INTEGER_INPUT,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    copy_step,
    no_flops,
    per_output,
)
from engine.ops._onnx import ONNX_DTYPES, Exported, OnnxForm, inputs_as_attrs

# ONNX TensorProto element types, for ``Cast(to=...)`` as ONNX writes it
ONNX_TYPES = {1: "float32", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8",
              9: "bool"}


def target_dtype(to: Any) -> DType:
    """``to`` as a dtype: a name (``"float32"``) or an ONNX element type number."""
    if isinstance(to, int) and not isinstance(to, bool):
        if to not in ONNX_TYPES:
            raise ShapeError(f"Cast: ONNX element type {to} is not supported (supported: "
                             f"{', '.join(f'{k} ({v})' for k, v in ONNX_TYPES.items())})")
        return DType(ONNX_TYPES[to])
    try:
        return DType.of(to)
    except ValueError as e:
        raise ShapeError(f"Cast: {e}") from None


def _cast_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if attrs["to"] is None:
        raise ShapeError("Cast needs the attribute 'to'")
    return [TensorDesc(target_dtype(attrs["to"]), ins[0].shape)]


def _cast(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    if y.dtype == x.dtype:
        return copy_step(xp, y, x)
    if y.dtype.kind == "b":
        return lambda: xp.not_equal(x, 0, out=y)  # ONNX: nonzero is True
    # Float to integer truncates toward zero (ONNX and C); out-of-range values are
    # undefined in ONNX, and here wrap as numpy's unsafe cast does.
    return lambda: xp.copyto(y, x, casting="unsafe")


def _g_cast(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    src = gb.desc(n.inputs[0]).dtype
    if g[0] is None or not src.is_float:
        return [None]  # nothing flows back into integers
    return [gb.op("Cast", g[0], to=src.value)]


def _dequantize_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    if x.dtype not in (DType.UINT8, DType.INT8, DType.INT32):
        raise ShapeError(f"DequantizeLinear takes uint8, int8 or int32 input, got "
                         f"{x.dtype.value}")
    if attrs["scale"] is None:
        raise ShapeError("DequantizeLinear needs the attribute 'scale'")
    _scale_shape(x.shape, attrs)
    return [TensorDesc(DType.FLOAT32, x.shape)]


def _scale_shape(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    """The shape ``scale`` (and ``zero_point``) broadcast with, after ``x`` is viewed
    as ``_blocked(shape)``: () per tensor; per axis, ``shape[axis]`` along ``axis``;
    blocked (``block_size``), one value per block of ``block_size`` along ``axis``."""
    scale = attrs["scale"]
    if not isinstance(scale, tuple | list):
        return ()
    n = len(scale)
    axis = attrs["axis"] % max(len(shape), 1) if shape else 0
    block = int(attrs.get("block_size") or 0)
    zp = attrs["zero_point"]
    if isinstance(zp, tuple | list) and len(zp) != n:
        raise ShapeError(f"DequantizeLinear: zero_point has {len(zp)} values, scale {n}")
    if not shape:
        raise ShapeError("DequantizeLinear: a scale per axis needs an input of rank >= 1")
    d = shape[axis]
    if block:
        if d % block or n * block != d * _others(shape, axis):
            raise ShapeError(f"DequantizeLinear: {n} scales for axis {axis} of {shape} in "
                             f"blocks of {block}")
        return (*shape[:axis], d // block, 1, *shape[axis + 1:])
    if n != d:
        raise ShapeError(f"DequantizeLinear: {n} scales for axis {axis} of length {d}")
    return tuple(d if i == axis else 1 for i in range(len(shape)))


def _others(shape: tuple[int, ...], axis: int) -> int:
    n = 1
    for i, v in enumerate(shape):
        if i != axis:
            n *= v
    return n


def _blocked(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    block = int(attrs.get("block_size") or 0)
    if not block or not isinstance(attrs["scale"], tuple | list):
        return shape
    axis = attrs["axis"] % len(shape)
    return (*shape[:axis], shape[axis] // block, block, *shape[axis + 1:])


def _dequantize(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    bshape = _scale_shape(tuple(x.shape), k.attrs)
    # Per-tensor values are scalars; per-axis ones small constant arrays, made here,
    # once, when the program is loaded (the size of the attribute itself).
    scale = xp.asarray(k.attrs["scale"], dtype=xp.float32).reshape(bshape)
    zero = xp.asarray(k.attrs["zero_point"], dtype=xp.float32)
    zero = zero.reshape(bshape) if zero.size > 1 else zero.reshape(())
    yb = y.reshape(_blocked(tuple(y.shape), k.attrs))
    has_zero = bool((zero != 0).any())

    def step() -> None:
        xp.copyto(y, x, casting="unsafe")
        if has_zero:
            xp.subtract(yb, zero, out=yb)
        xp.multiply(yb, scale, out=yb)

    return step


def _export_cast(n: Node, helper: Any, nh: Any) -> Exported:
    to = ONNX_DTYPES[target_dtype(n.attrs["to"]).value]
    return [helper.make_node("Cast", [n.inputs[0]], list(n.outputs), to=to)], []


def _export_dequantize(n: Node, helper: Any, nh: Any) -> Exported:
    scale = nh.from_array(np.asarray(n.attrs["scale"], dtype=np.float32), f"{n.outputs[0]}:scale")
    extra = [scale]
    ins = [n.inputs[0], scale.name]
    if n.attrs.get("zero_point"):
        zp = nh.from_array(np.asarray(n.attrs["zero_point"], dtype=n.attrs.get("zero_dtype")
                                      or "uint8"), f"{n.outputs[0]}:zero_point")
        extra.append(zp)
        ins.append(zp.name)
    return [helper.make_node("DequantizeLinear", ins, list(n.outputs))], extra


OPS = [
    OpDef(name="Cast", shape=_cast_shape, kernel=_cast, grad=_g_cast,
          flops=no_flops,
          attrs={"to": None, "saturate": 1}, stacking=StackRule.ELEMENTWISE,
          onnx=OnnxForm(name="Cast", export=_export_cast),
          doc="ONNX Cast: convert to the element type `to` (a name or an ONNX type number)"),
    OpDef(name="DequantizeLinear", shape=_dequantize_shape, kernel=_dequantize, grad=INTEGER_INPUT,
          flops=per_output(2),
          attrs={"scale": None, "zero_point": 0, "axis": 1, "block_size": 0,
                 "output_dtype": 0}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="DequantizeLinear", export=_export_dequantize,
                        import_=inputs_as_attrs("scale", "zero_point"), attr_inputs=(1, 2)),
          doc="ONNX DequantizeLinear: (x - zero_point) * scale as float32; one scale, one "
              "per index of `axis`, or one per block of `block_size` along it"),
]
