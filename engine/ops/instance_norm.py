"""``InstanceNormalization`` (ONNX): each sample's channel normalised over its own
spatial positions, then scaled and shifted per channel.  PyTorch's ``InstanceNorm*d``
export to it, and so does ``GroupNorm`` (as the groups reshaped into channels).

Its gradient is written with existing ops (the moments again, then the usual
``istd (dx-hat - mean(dx-hat) - x-hat mean(dx-hat x-hat))``), so it keeps nothing of
the forward pass but ``x``.

>>> import numpy as np
>>> from engine import CalcGraph, Init, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 2, 3))
>>> s = g.parameter("s", (2,), init=Init.constant(1.0))
>>> b = g.parameter("b", (2,), init=Init.constant(0.0))
>>> p = g.path("eval", Mode.FORWARD_ONLY)
>>> g.output(p.InstanceNormalization(x, s, b, outputs=["y"]))
>>> vm = VM(compile_graph(g, batch_size=1))
>>> vm.set("x", np.array([[[1, 2, 3], [5, 5, 5]]], np.float32)); vm.forward("eval")
>>> [[round(float(v), 3) for v in row] for row in vm.get("y")[0]]
[[-1.225, 0.0, 1.225], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    need_float,
    per_output,
)
from engine.ops._onnx import OnnxForm
from engine.ops.norm import moments

INSTANCE_NORM_FLOPS = 8
"""Per element: the moments (a sum, a difference, a square, a sum) and ``(x - mean) ·
istd · scale + B``."""


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    need_float(x, "InstanceNormalization input")
    if len(x.shape) < 3:
        raise ShapeError(f"InstanceNormalization needs [N, C, D1, ...], got {x.shape}")
    c = x.shape[1]
    for d, what in zip(ins[1:], ("scale", "B"), strict=True):
        if d.shape != (c,) or d.dtype != x.dtype:
            raise ShapeError(f"InstanceNormalization: {what} is {d.dtype.value} {d.shape}; "
                             f"the input {x.shape} needs {x.dtype.value} ({c},)")
    return [x]


def _stats(x: TensorDesc) -> int:
    """Bytes of one per-(sample, channel) statistic at the compiled batch."""
    return align_up(x.shape[0] * x.shape[1] * x.dtype.itemsize)


def _ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return 2 * _stats(ins[0])


def _kernel(k: KernelArgs) -> Step:
    xp, (x, scale, bias), y = k.xp, k.ins, k.outs[0]
    axes = tuple(range(2, x.ndim))
    stat_shape = (*x.shape[:2], *(1,) * (x.ndim - 2))
    per_channel = (x.shape[1], *(1,) * (x.ndim - 2))
    size = align_up(x.shape[0] * x.shape[1] * x.dtype.itemsize)
    mean, istd = (k.scratch(i * size, stat_shape, x.dtype) for i in range(2))
    count = x.size // max(x.shape[0] * x.shape[1], 1)
    eps = float(k.attrs["epsilon"])
    s, b = scale.reshape(per_channel), bias.reshape(per_channel)

    def step() -> None:
        moments(xp, x, axes, mean, istd, y, 1.0 / max(count, 1), eps)
        xp.subtract(x, mean, out=y)
        xp.multiply(y, istd, out=y)
        xp.multiply(y, s, out=y)
        xp.add(y, b, out=y)

    return step


def _grad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None, None]
    x, scale, _ = n.inputs
    shape = gb.desc(x).shape
    spatial = tuple(range(2, len(shape)))
    mean = gb.op("ReduceMean", x, axes=spatial, keepdims=1)
    centred = gb.op("Sub", x, mean)
    var = gb.op("ReduceMean", gb.op("Mul", centred, centred), axes=spatial, keepdims=1)
    eps = gb.const(float(n.attrs["epsilon"]), like=x)
    istd = gb.op("Reciprocal", gb.op("Sqrt", gb.op("Add", var, eps)))
    xhat = gb.op("Mul", centred, istd)
    per_channel = (shape[1], *(1,) * len(spatial))
    dxhat = gb.op("Mul", g[0], gb.op("Reshape", scale, shape=per_channel))
    m1 = gb.op("ReduceMean", dxhat, axes=spatial, keepdims=1)
    m2 = gb.op("ReduceMean", gb.op("Mul", dxhat, xhat), axes=spatial, keepdims=1)
    dx = gb.op("Mul", istd, gb.op("Sub", gb.op("Sub", dxhat, m1), gb.op("Mul", xhat, m2)))
    over = (0, *spatial)
    d_scale = gb.op("ReduceSum", gb.op("Mul", g[0], xhat), axes=over, keepdims=0)
    d_bias = gb.op("ReduceSum", g[0], axes=over, keepdims=0)
    return [dx, d_scale, d_bias]


OPS = [
    OpDef(name="InstanceNormalization", shape=_shape, kernel=_kernel, grad=_grad,
          workspace=_ws, flops=per_output(INSTANCE_NORM_FLOPS), num_inputs=(3, 3),
          attrs={"epsilon": 1e-5}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="InstanceNormalization"),
          doc="ONNX InstanceNormalization: each sample's channel over its positions, "
              "then scale and B per channel"),
]
