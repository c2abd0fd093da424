"""``Pow`` (ONNX): ``x ** y`` with broadcasting, the result in ``x``'s element type
whatever ``y``'s is (float to an integer power, an integer to a float power, ...).

Gradients: ``dX = dY * y * x^(y - 1)`` and, for a float exponent, ``dY * x^y * log(x)``
(not finite where x <= 0, as in every framework).

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (3,)); e = g.placeholder("e", (3,), dtype="int64")
>>> y = g.path("p", Mode.FORWARD_ONLY).Pow(x, e)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
>>> vm.set("x", np.array([2, 3, 4], np.float32)); vm.set("e", np.array([3, 2, 0]))
>>> vm.forward("p"); vm.get(y.name).tolist()
[8.0, 9.0, 1.0]
"""

from __future__ import annotations

from typing import Any

from engine.graph import TensorDesc
from engine.ops._base import (
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    broadcast_shapes,
    per_output,
)
from engine.ops._onnx import OnnxForm
from engine.ops.elementwise import unbroadcast


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [TensorDesc(ins[0].dtype, broadcast_shapes(ins[0].shape, ins[1].shape))]


def _kernel(k: KernelArgs) -> Step:
    xp, (x, e), y = k.xp, k.ins, k.outs[0]
    if x.dtype == e.dtype:
        return lambda: xp.power(x, e, out=y)
    # Mixed types: numpy computes in the wider type and casts back to x's, as ONNX says.
    loop = xp.result_type(x.dtype, e.dtype)
    return lambda: xp.power(x, e, out=y, dtype=loop, casting="unsafe")


def _grad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    x, e = n.inputs
    xd = gb.desc(x).dtype
    if not xd.is_float:
        return [None, None]
    ef = e if gb.desc(e).dtype == xd else gb.op("Cast", e, to=xd.value)
    one = gb.const(1.0, like=x)
    dx = gb.op("Mul", gb.op("Mul", g[0], ef), gb.op("Pow", x, gb.op("Sub", ef, one)))
    de = None
    if gb.desc(e).dtype.is_float:
        de = unbroadcast(gb, gb.op("Mul", gb.op("Mul", g[0], n.outputs[0]), gb.op("Log", x)), e)
    return [unbroadcast(gb, dx, x), de]


OPS = [
    OpDef(name="Pow", shape=_shape, kernel=_kernel, grad=_grad, num_inputs=(2, 2),
          flops=per_output(1),
          stacking=NOT_STACKED, onnx=OnnxForm(name="Pow"),
          doc="x ** y, broadcasting, in x's element type"),
]
