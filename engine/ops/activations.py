"""More elementwise functions of ONNX: Floor, Ceil, Reciprocal, Softplus, Softsign,
HardSigmoid, HardSwish (MobileNetV3's), Mish, Selu, Celu and PRelu (its slope a
parameter), each with its gradient written with existing ops."""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.graph import Node, TensorDesc
from engine.ops._base import (
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    broadcast_shapes,
    need_float,
    per_output,
    same_dtype,
)
from engine.ops._onnx import Exported, OnnxForm
from engine.ops.elementwise import (
    _g_zero,
    _ufunc_kernel,
    _ws_same,
    elu_into,
    float_unary_shape,
    unbroadcast,
)


def _g_reciprocal(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    y = n.outputs[0]
    return [gb.op("Neg", gb.op("Mul", g[0], gb.op("Mul", y, y)))]  # d(1/x) = -1/x^2


def _softplus(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    return lambda: xp.logaddexp(0.0, x, out=y)  # log(1 + e^x), without overflow


def _g_softplus(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Mul", g[0], gb.op("Sigmoid", n.inputs[0]))] if g[0] else [None]


def _softsign(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]

    def step() -> None:
        xp.absolute(x, out=y)
        xp.add(y, 1.0, out=y)
        xp.divide(x, y, out=y)

    return step


def _g_softsign(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    t = gb.op("Add", gb.op("Abs", n.inputs[0]), gb.const(1.0, like=n.inputs[0]))
    return [gb.op("Div", g[0], gb.op("Mul", t, t))]  # 1 / (1 + |x|)^2


def _hard_sigmoid(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    a, b = float(k.attrs["alpha"]), float(k.attrs["beta"])

    def step() -> None:
        xp.multiply(x, a, out=y)
        xp.add(y, b, out=y)
        xp.clip(y, 0.0, 1.0, out=y)

    return step


def _g_hard_sigmoid(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    x = n.inputs[0]
    a, b = float(n.attrs["alpha"]), float(n.attrs["beta"])
    z = gb.op("Add", gb.op("Mul", x, gb.const(a, like=x)), gb.const(b, like=x))
    return [gb.op("Mul", gb.op("ClipGrad", z, g[0], min=0.0, max=1.0), gb.const(a, like=x))]


HARD_SWISH = {"alpha": 1.0 / 6.0, "beta": 0.5}  # ONNX's HardSwish: x HardSigmoid(x)


def _hard_swish(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    a, b = HARD_SWISH["alpha"], HARD_SWISH["beta"]

    def step() -> None:
        xp.multiply(x, a, out=y)
        xp.add(y, b, out=y)
        xp.clip(y, 0.0, 1.0, out=y)
        xp.multiply(y, x, out=y)

    return step


def _g_hard_swish(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    """d(x h(x)) = h(x) + x h'(x) = x / 3 + 1/2 strictly between -3 and 3; 0 at and below
    -3, 1 at and above 3 (PyTorch's choice at the kinks)."""
    if not g[0]:
        return [None]
    x = n.inputs[0]
    slope = gb.op("Add", gb.op("Mul", x, gb.const(1.0 / 3.0, like=x)), gb.const(0.5, like=x))
    inside = gb.op("Where", gb.op("Greater", x, gb.const(-3.0, like=x)),
                   gb.op("Mul", g[0], slope), gb.const(0.0, like=x))
    return [gb.op("Where", gb.op("Less", x, gb.const(3.0, like=x)), inside, g[0])]


def _mish(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]

    def step() -> None:
        xp.logaddexp(0.0, x, out=y)  # softplus, without overflow
        xp.tanh(y, out=y)
        xp.multiply(y, x, out=y)

    return step


def _g_mish(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    """d(x tanh(sp(x))) = t + x sigmoid(x) (1 - t^2), t = tanh(sp(x))."""
    if not g[0]:
        return [None]
    x = n.inputs[0]
    t = gb.op("Tanh", gb.op("Softplus", x))
    slope = gb.op("Sub", gb.const(1.0, like=x), gb.op("Mul", t, t))
    d = gb.op("Add", t, gb.op("Mul", gb.op("Mul", x, gb.op("Sigmoid", x)), slope))
    return [gb.op("Mul", g[0], d)]


SELU = {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}  # ONNX's


def _selu(k: KernelArgs) -> Step:
    """``gamma elu(x; alpha)``."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    a, gamma = float(k.attrs["alpha"]), float(k.attrs["gamma"])
    pos = k.scratch(0, x.shape, x.dtype)

    def step() -> None:
        elu_into(xp, x, y, pos, a)
        xp.multiply(y, gamma, out=y)

    return step


def _g_selu(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    x, a = n.inputs[0], float(n.attrs["alpha"])
    scaled = gb.op("Mul", g[0], gb.const(float(n.attrs["gamma"]), like=x))
    return [gb.op("EluGrad", x, gb.op("Elu", x, alpha=a), scaled, alpha=a)]


def _celu(k: KernelArgs) -> Step:
    """``max(0, x) + min(0, alpha (exp(x / alpha) - 1))``."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    a = float(k.attrs["alpha"])
    if a == 0:
        raise ShapeError("Celu: alpha must not be 0")
    pos = k.scratch(0, x.shape, x.dtype)
    return lambda: elu_into(xp, x, y, pos, a, inner=1.0 / a)


def _g_celu(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    """dx = g where x > 0, else g exp(x / alpha) (whatever alpha's sign)."""
    if not g[0]:
        return [None]
    x, a = n.inputs[0], float(n.attrs["alpha"])
    below = gb.op("Mul", g[0], gb.op("Exp", gb.op("Mul", x, gb.const(1.0 / a, like=x))))
    return [gb.op("Where", gb.op("Greater", x, gb.const(0.0, like=x)), g[0], below)]


def _prelu_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, slope = ins
    need_float(x)
    dt = same_dtype(ins)
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ShapeError(f"PRelu: slope {slope.shape} does not broadcast to the input "
                         f"{x.shape}")
    return [TensorDesc(dt, x.shape)]


def _prelu(k: KernelArgs) -> Step:
    """``max(0, x) + slope min(0, x)``."""
    xp, (x, slope), y = k.xp, k.ins, k.outs[0]
    pos = k.scratch(0, x.shape, x.dtype)

    def step() -> None:
        xp.minimum(x, 0, out=y)
        xp.multiply(y, slope, out=y)
        xp.maximum(x, 0, out=pos)
        xp.add(y, pos, out=y)

    return step


def _g_prelu(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    """dx = g where x > 0, else slope g; d slope = g min(0, x), summed to its shape."""
    if not g[0]:
        return [None, None]
    x, slope = n.inputs
    positive = gb.op("Greater", x, gb.const(0.0, like=x))
    dx = gb.op("Where", positive, g[0], gb.op("Mul", g[0], slope))
    d_slope = gb.op("Mul", g[0], gb.op("Min", x, gb.const(0.0, like=x)))
    return [dx, unbroadcast(gb, d_slope, slope)]


def _export_mish(n: Node, helper: Any, nh: Any) -> Exported:
    """ONNX before opset 18 (the exporter writes 17) has no Mish: ``x tanh(softplus(x))``."""
    x, (y,) = n.inputs[0], n.outputs
    mk = helper.make_node
    return [mk("Softplus", [x], [f"{y}_sp"]), mk("Tanh", [f"{y}_sp"], [f"{y}_t"]),
            mk("Mul", [x, f"{y}_t"], [y])], []


def _unary(name: str, kernel: Any, grad: Any, doc: str, inplace: tuple[int, ...] = (0,),
           attrs: dict[str, Any] | None = None, export: Any = None) -> OpDef:
    return OpDef(name=name, shape=float_unary_shape, kernel=kernel, grad=grad, inplace=inplace,
                 flops=per_output(1), attrs=attrs or {}, stacking=StackRule.ELEMENTWISE,
                 onnx=OnnxForm(name=name, export=export), doc=doc)


OPS = [
    _unary("Floor", _ufunc_kernel("floor"), _g_zero, "largest integer <= x"),
    _unary("Ceil", _ufunc_kernel("ceil"), _g_zero, "smallest integer >= x"),
    _unary("Reciprocal", _ufunc_kernel("reciprocal"), _g_reciprocal, "1 / x"),
    _unary("Softplus", _softplus, _g_softplus, "log(1 + exp(x))"),
    _unary("Softsign", _softsign, _g_softsign, "x / (1 + |x|)", inplace=()),
    _unary("HardSigmoid", _hard_sigmoid, _g_hard_sigmoid, "max(0, min(1, alpha x + beta))",
           attrs={"alpha": 0.2, "beta": 0.5}),
    _unary("HardSwish", _hard_swish, _g_hard_swish, "x max(0, min(1, x / 6 + 1/2))",
           inplace=()),
    _unary("Mish", _mish, _g_mish, "x tanh(log(1 + exp(x)))", inplace=(),
           export=_export_mish),
    OpDef(name="Selu", shape=float_unary_shape, kernel=_selu, grad=_g_selu,
          workspace=_ws_same, flops=per_output(1), attrs=dict(SELU),
          stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Selu"),
          doc="gamma (x if x > 0 else alpha (exp(x) - 1))"),
    OpDef(name="Celu", shape=float_unary_shape, kernel=_celu, grad=_g_celu,
          workspace=_ws_same, flops=per_output(1), attrs={"alpha": 1.0},
          stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Celu"),
          doc="max(0, x) + min(0, alpha (exp(x / alpha) - 1))"),
    OpDef(name="PRelu", shape=_prelu_shape, kernel=_prelu, grad=_g_prelu,
          workspace=_ws_same, flops=per_output(2), num_inputs=(2, 2),
          stacking=StackRule.BROADCAST, onnx=OnnxForm(name="PRelu"),
          doc="x if x > 0 else slope x (the slope broadcast to x, as PyTorch's PReLU)"),
]
