"""GELU as one op, ``Gelu`` (``x * Phi(x)``, Phi the normal distribution; ONNX's from
opset 20, written out for older opsets as ``Erf`` and products), and its gradient
``GeluGrad``, which reads only ``x``.

Composed of elementwise ops, a GELU kept every intermediate of its error function for
the backward pass (ten tensors the size of ``x``: in a transformer's feed-forward, most
of a layer's bytes per row); fused, it keeps ``x`` alone and works in two workspace
buffers.  ``approximate="none"`` computes the error function by Abramowitz & Stegun
7.1.26 (absolute error below 1.5e-7, under float32's rounding of the result);
``"tanh"`` is PyTorch's ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 3)); p = g.path("eval", Mode.FORWARD_ONLY)
>>> g.output(p.Gelu(x, outputs=["y"]))
>>> vm = VM(compile_graph(g, batch_size=1)); vm.set("x", np.array([[-1, 0, 1]], np.float32))
>>> vm.forward("eval"); [round(float(v), 4) for v in vm.get("y")[0]]
[-0.1587, 0.0, 0.8413]
"""

from __future__ import annotations

import math
from typing import Any

from engine.alignment import align_up
from engine.errors import GraphError
from engine.graph import Node, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    per_output,
)
from engine.ops._onnx import ENGINE_INTERNAL, Exported, OnnxForm
from engine.ops.elementwise import float_unary_shape, grad_like_second

APPROXIMATIONS = ("none", "tanh")
# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t (a1 + t (a2 + ...)) exp(-z^2), t = 1/(1 + p z)
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# erf's Taylor series over 2x/sqrt(pi), in s = x^2: (-1)^n s^n / (n! (2n + 1)), n = 0..5
ERF_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(6))
TANH_C = math.sqrt(2.0 / math.pi)
TANH_K = 0.044715


def _approximate(attrs: dict[str, Any]) -> str:
    a = str(attrs.get("approximate", "none"))
    if a not in APPROXIMATIONS:
        raise GraphError(f"Gelu: approximate must be 'none' or 'tanh', got {a!r}")
    return a


def _ws(count: int) -> Any:
    def rule(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any],
             device: str) -> int:
        return count * align_up(ins[0].nbytes())

    return rule


def _buffers(k: KernelArgs, count: int) -> list[Any]:
    x = k.ins[0]
    return [k.scratch(i * align_up(x.nbytes), x.shape, x.dtype) for i in range(count)]


def _phi(xp: Any, x: Any, out: Any, t: Any, e: Any) -> None:
    """``out = Phi(x)`` and ``e = exp(-x^2 / 2)``; ``t`` is scratch, ``out`` another
    buffer than ``x``."""
    xp.absolute(x, out=e)
    xp.multiply(e, 1.0 / math.sqrt(2.0), out=e)  # z = |x| / sqrt 2
    xp.multiply(e, ERF_P, out=t)
    xp.add(t, 1.0, out=t)
    xp.reciprocal(t, out=t)  # t = 1 / (1 + p z)
    xp.square(e, out=e)
    xp.negative(e, out=e)
    xp.exp(e, out=e)  # exp(-z^2)
    xp.multiply(t, ERF_A[4], out=out)  # Horner: (((a5 t + a4) t + ...) + a1) t
    for c in reversed(ERF_A[:4]):
        xp.add(out, c, out=out)
        xp.multiply(out, t, out=out)
    xp.multiply(out, e, out=out)  # q = 1 - erf(z)
    xp.sign(x, out=t)
    xp.subtract(1.0, out, out=out)
    xp.multiply(out, t, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, 0.5, out=out)  # Phi(x) = (1 + sign(x) erf(z)) / 2


def _tanh_inner(xp: Any, x: Any, out: Any) -> None:
    """``out = tanh(c (x + k x^3))``."""
    xp.square(x, out=out)
    xp.multiply(out, TANH_K, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, TANH_C, out=out)
    xp.tanh(out, out=out)


def _gelu(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    if _approximate(k.attrs) == "tanh":
        (t,) = _buffers(k, 1)

        def tanh_step() -> None:
            _tanh_inner(xp, x, t)
            xp.add(t, 1.0, out=t)
            xp.multiply(t, x, out=y)
            xp.multiply(y, 0.5, out=y)

        return tanh_step
    t, e = _buffers(k, 2)

    def step() -> None:
        _phi(xp, x, y, t, e)
        xp.multiply(y, x, out=y)

    return step


def _gelu_grad(k: KernelArgs) -> Step:
    """``dx = dy (Phi(x) + x phi(x))``; tanh: ``dy (0.5 (1 + th) + 0.5 x c (1 + 3 k x^2)
    (1 - th^2))``, ``th = tanh(c (x + k x^3))``.  The factor is made in the workspace,
    so ``dx`` may take ``dy``'s bytes."""
    xp, x, dy, dx = k.xp, k.ins[0], k.ins[1], k.outs[0]
    t, e, q = _buffers(k, 3)
    if _approximate(k.attrs) == "tanh":
        def tanh_step() -> None:
            _tanh_inner(xp, x, t)  # th
            xp.square(x, out=e)
            xp.multiply(e, 3.0 * TANH_K, out=e)
            xp.add(e, 1.0, out=e)
            xp.multiply(e, x, out=e)
            xp.multiply(e, 0.5 * TANH_C, out=e)  # 0.5 x c (1 + 3 k x^2)
            xp.square(t, out=q)
            xp.subtract(1.0, q, out=q)
            xp.multiply(e, q, out=e)
            xp.add(t, 1.0, out=t)
            xp.multiply(t, 0.5, out=t)
            xp.add(e, t, out=e)
            xp.multiply(e, dy, out=dx)

        return tanh_step

    def step() -> None:
        _phi(xp, x, q, t, e)
        xp.multiply(e, x, out=e)
        xp.multiply(e, 1.0 / math.sqrt(2.0 * math.pi), out=e)  # x phi(x)
        xp.add(q, e, out=q)
        xp.multiply(q, dy, out=dx)

    return step


def _erf(k: KernelArgs) -> Step:
    """``erf(x)``: Abramowitz & Stegun 7.1.26 where ``|x| >= 1/2`` (an absolute error
    below 1.5e-7 where erf is at least 0.52), its Taylor series to ``x^11`` nearer
    zero, where erf is as small as ``x`` and an absolute error would be a large
    relative one (a relative error under 3e-8 there in float64)."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    t, e = _buffers(k, 2)
    near = k.scratch(2 * align_up(x.nbytes), x.shape, "bool")

    def step() -> None:
        xp.absolute(x, out=e)
        xp.multiply(e, ERF_P, out=t)
        xp.add(t, 1.0, out=t)
        xp.reciprocal(t, out=t)  # t = 1 / (1 + p |x|)
        xp.square(e, out=e)
        xp.negative(e, out=e)
        xp.exp(e, out=e)  # exp(-x^2)
        xp.multiply(t, ERF_A[4], out=y)
        for c in reversed(ERF_A[:4]):
            xp.add(y, c, out=y)
            xp.multiply(y, t, out=y)
        xp.multiply(y, e, out=y)  # 1 - erf(|x|)
        xp.subtract(1.0, y, out=y)
        xp.sign(x, out=t)
        xp.multiply(y, t, out=y)
        xp.square(x, out=e)  # the series in s = x^2: x (1 - s/3 + s^2/10 - ...) 2/sqrt(pi)
        xp.multiply(e, ERF_SERIES[5], out=t)  # Horner: ((c5 s + c4) s + ...) s + c0
        for c in reversed(ERF_SERIES[1:5]):
            xp.add(t, c, out=t)
            xp.multiply(t, e, out=t)
        xp.add(t, ERF_SERIES[0], out=t)
        xp.multiply(t, x, out=t)
        xp.multiply(t, 2.0 / math.sqrt(math.pi), out=t)
        xp.absolute(x, out=e)
        xp.less(e, 0.5, out=near)
        xp.copyto(y, t, where=near)

    return step


def _erf_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any],
            device: str) -> int:
    return 2 * align_up(ins[0].nbytes()) + align_up(ins[0].numel())


def _g_erf(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    x = n.inputs[0]
    density = gb.op("Exp", gb.op("Neg", gb.op("Mul", x, x)))
    return [gb.op("Mul", g[0], gb.op("Mul", density, gb.const(2.0 / math.sqrt(math.pi),
                                                               like=x)))]


def _g_gelu(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    return [gb.op("GeluGrad", n.inputs[0], g[0], approximate=_approximate(n.attrs))]


def _export_gelu(n: Node, helper: Any, nh: Any) -> Exported:
    """ONNX before opset 20 has no Gelu: ``x * (1 + erf(x / sqrt 2)) / 2`` (``Erf``), or
    the tanh form, written with elementwise nodes."""
    import numpy as np

    x, (y,) = n.inputs[0], n.outputs
    c = {name: nh.from_array(np.array(v, np.float32), f"{y}_{name}") for name, v in
         (("half", 0.5), ("one", 1.0), ("root2", math.sqrt(2.0)), ("c", TANH_C),
          ("k", TANH_K))}
    mk = helper.make_node
    if _approximate(n.attrs) == "tanh":
        nodes = [mk("Mul", [x, x], [f"{y}_x2"]),
                 mk("Mul", [f"{y}_x2", f"{y}_k"], [f"{y}_kx2"]),
                 mk("Add", [f"{y}_kx2", f"{y}_one"], [f"{y}_p"]),
                 mk("Mul", [f"{y}_p", x], [f"{y}_u"]),
                 mk("Mul", [f"{y}_u", f"{y}_c"], [f"{y}_cu"]),
                 mk("Tanh", [f"{y}_cu"], [f"{y}_th"]),
                 mk("Add", [f"{y}_th", f"{y}_one"], [f"{y}_s"])]
    else:
        nodes = [mk("Div", [x, f"{y}_root2"], [f"{y}_z"]),
                 mk("Erf", [f"{y}_z"], [f"{y}_erf"]),
                 mk("Add", [f"{y}_erf", f"{y}_one"], [f"{y}_s"])]
    nodes += [mk("Mul", [x, f"{y}_s"], [f"{y}_xs"]),
              mk("Mul", [f"{y}_xs", f"{y}_half"], [y])]
    used = {i for node in nodes for i in node.input}
    return nodes, [t for t in c.values() if t.name in used]  # onnxruntime warns of others


OPS = [
    OpDef(name="Gelu", shape=float_unary_shape, kernel=_gelu, grad=_g_gelu,
          workspace=_ws(2), flops=per_output(1), attrs={"approximate": "none"},
          stacking=StackRule.ELEMENTWISE,
          onnx=OnnxForm(name="Gelu", export=_export_gelu),
          doc="x * Phi(x) (approximate: none | tanh)"),
    OpDef(name="Erf", shape=float_unary_shape, kernel=_erf, grad=_g_erf, workspace=_erf_ws,
          flops=per_output(1), stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Erf"),
          doc="the error function (GELU as older ONNX opsets write it)"),
    OpDef(name="GeluGrad", shape=grad_like_second, kernel=_gelu_grad, grad=FIRST_ORDER_ONLY,
          workspace=_ws(3), flops=per_output(5), attrs={"approximate": "none"},
          inplace=(1,), num_inputs=(2, 2), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy * (Phi(x) + x phi(x)), from x alone"),
]
