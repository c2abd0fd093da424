"""Elementwise operators: unary math, activations, and broadcasting binary arithmetic.

Every kernel writes through ``out=`` into preallocated views, so a step allocates
nothing.  Activation gradients use fused gradient ops (``SigmoidGrad`` ...), as
onnxruntime's training ops do, so the backward pass reads the saved output rather
than recomputing the activation.

Sigmoid, Tanh (float32), the activation gradients and SumTo also have a compiled
variant (:mod:`engine.ops.jit`: ``"numba"`` beside ``"numpy"``) that does their
arithmetic in one pass (float32's tanh a rational function LLVM vectorises, as numpy's
is a scalar loop on AVX2 machines); their kernel picks one by size.  Relu is one numpy
call already: there is nothing to fuse (a Linear layer's bias is fused with it in
``FusedGemm``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.graph import DType, Node, TensorDesc
from engine.ops import jit
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    broadcast_shapes,
    copy_step,
    need_float,
    no_flops,
    no_workspace,
    per_input,
    per_output,
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL, EngineInternal, Exported, OnnxForm

# Shape rules see generic shapes, where a leading 0 is the (symbolic) batch size.
# -- shape rules ---------------------------------------------------------------------


def unary_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[0]]


def float_unary_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    return [ins[0]]


def binary_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    return [TensorDesc(dt, broadcast_shapes(ins[0].shape, ins[1].shape))]


def grad_like_second(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    """Shape rule of ``XGrad(saved, dy)``: the gradient has the saved tensor's shape."""
    if ins[0].shape != ins[-1].shape:
        raise ShapeError(f"saved tensor {ins[0].shape} and gradient {ins[-1].shape} differ")
    return [ins[-1]]


def sum_to_axes(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, ...]:
    """Axes of ``src`` to sum (keeping dims) so that it reshapes to ``dst``: the
    reverse of broadcasting ``dst`` to ``src``."""
    lead = len(src) - len(dst)
    axes = list(range(lead))
    for i, d in enumerate(dst):
        if d == 1 and src[lead + i] != 1:
            axes.append(lead + i)
    return tuple(axes)


def unbroadcast(gb: GradBuilder, g: str, target: str) -> str:
    """Reduce gradient ``g`` to the shape of ``target`` (undo broadcasting)."""
    src = gb.desc(g).shape
    dst = gb.desc(target).shape
    if src == dst:
        return g
    axes = sum_to_axes(src, dst)
    return gb.op("SumTo", g, axes=axes, shape=dst)


# -- unary kernels -------------------------------------------------------------------


def _ufunc_kernel(name: str) -> Any:
    def factory(k: KernelArgs) -> Step:
        f = getattr(k.xp, name)
        x, y = k.ins[0], k.outs[0]
        return lambda: f(x, out=y)

    return factory


def _relu(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    return lambda: xp.maximum(x, 0, out=y)


def _leaky_relu(k: KernelArgs) -> Step:
    xp, x, y, a = k.xp, k.ins[0], k.outs[0], float(k.attrs["alpha"])
    pick = xp.maximum if a <= 1.0 else xp.minimum

    def step() -> None:
        xp.multiply(x, a, out=y)
        pick(x, y, out=y)

    return step


def elu_into(xp: Any, x: Any, y: Any, pos: Any, alpha: float, inner: float = 1.0) -> None:
    """``y = alpha (exp(inner min(x, 0)) - 1) + max(x, 0)``, ``pos`` scratch of x's
    shape: Elu (``inner`` 1), Celu (``1 / alpha``) and, scaled after, Selu."""
    xp.minimum(x, 0, out=y)
    if inner != 1.0:
        xp.multiply(y, inner, out=y)
    xp.expm1(y, out=y)
    xp.multiply(y, alpha, out=y)
    xp.maximum(x, 0, out=pos)
    xp.add(y, pos, out=y)


def _elu(k: KernelArgs) -> Step:
    xp, x, y, a = k.xp, k.ins[0], k.outs[0], float(k.attrs["alpha"])
    pos = k.scratch(0, x.shape, x.dtype)
    return lambda: elu_into(xp, x, y, pos, a)


def _sigmoid(k: KernelArgs) -> Step:
    # 0.5 * tanh(0.5 x) + 0.5: no overflow for large |x|, no temporaries.
    xp, x, y = k.xp, k.ins[0], k.outs[0]

    def step() -> None:
        xp.multiply(x, 0.5, out=y)
        xp.tanh(y, out=y)
        xp.multiply(y, 0.5, out=y)
        xp.add(y, 0.5, out=y)

    return step


def _sigmoid_fused(k: KernelArgs, ks: Any) -> Step | None:
    # float32: one compiled pass around a rational tanh (engine.ops._jit_kernels.tanh1).
    # float64: the numpy kernel's four passes as three, numpy's tanh in the middle (the
    # rational one is float32's only).
    xp, x, y = k.xp, jit.flat(k.ins[0]), jit.flat(k.outs[0])
    if x is None or y is None or x.dtype != y.dtype:
        return None
    if x.dtype == np.float32:
        return _one_or_two(x, y, ks.sigmoid, ks.sigmoid_in_place)
    pre, post = ks.half, ks.half_plus_half

    def step() -> None:
        pre(x, y)
        xp.tanh(y, out=y)
        post(y)

    return step


def _float32(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return all(d.dtype is DType.FLOAT32 for d in outs)


def _tanh_fused(k: KernelArgs, ks: Any) -> Step | None:
    # float32 only: the rational tanh in one compiled pass; float64 stays numpy's.
    x, y = jit.flat(k.ins[0]), jit.flat(k.outs[0])
    if x is None or y is None or not x.dtype == y.dtype == np.float32:
        return None
    return _one_or_two(x, y, ks.tanh, ks.tanh_in_place)


def _one_or_two(x: Any, y: Any, two: Any, one: Any) -> Step:
    """``two(x, y)``, or ``one(y)`` where x and y are one array (an op run in place):
    LLVM's vectorised loop checks that the arrays do not overlap and runs scalar where
    they do."""
    if _address(x) == _address(y):
        return lambda: one(y)
    return lambda: two(x, y)


def _address(a: Any) -> int:
    return int(a.__array_interface__["data"][0])


def _ws_same(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ins[0].nbytes()


def _ws_bool_mask(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ins[0].numel()


# -- gradient kernels ----------------------------------------------------------------


def _sigmoid_grad(k: KernelArgs) -> Step:
    xp, (y, dy), dx = k.xp, k.ins, k.outs[0]

    def step() -> None:
        xp.subtract(1, y, out=dx)
        xp.multiply(dx, y, out=dx)
        xp.multiply(dx, dy, out=dx)

    return step


def _tanh_grad(k: KernelArgs) -> Step:
    xp, (y, dy), dx = k.xp, k.ins, k.outs[0]

    def step() -> None:
        xp.multiply(y, y, out=dx)
        xp.subtract(1, dx, out=dx)
        xp.multiply(dx, dy, out=dx)

    return step


def _relu_grad(k: KernelArgs) -> Step:
    # y = relu(x) >= 0, so sign(y) is exactly the 0/1 derivative.
    xp, (y, dy), dx = k.xp, k.ins, k.outs[0]

    def step() -> None:
        xp.sign(y, out=dx)
        xp.multiply(dx, dy, out=dx)

    return step


def _grad_fused(kernel: str) -> jit.FusedFactory:
    """``dx = f(y, dy)`` in one pass over flat views of the three tensors."""

    def factory(k: KernelArgs, ks: Any) -> Step | None:
        y, dy, dx = (jit.flat(a) for a in (*k.ins, k.outs[0]))
        if y is None or dy is None or dx is None or not y.dtype == dy.dtype == dx.dtype:
            return None
        if _address(dx) == _address(y):
            over_y = getattr(ks, f"{kernel}_over_y")
            return lambda: over_y(y, dy)
        if _address(dx) == _address(dy):
            over_dy = getattr(ks, f"{kernel}_over_dy")
            return lambda: over_dy(y, dy)
        run = getattr(ks, kernel)
        return lambda: run(y, dy, dx)

    return factory


SIGMOID = jit.variants(_sigmoid, _sigmoid_fused, no_workspace,
                       "float32: one compiled pass around a rational tanh; float64: x/2, "
                       "numpy's tanh, then /2 + 1/2, three passes instead of four")
TANH = jit.variants(_ufunc_kernel("tanh"), _tanh_fused, no_workspace,
                   "float32: a rational tanh in one compiled pass (numpy's float32 tanh is "
                   "a scalar loop)")
TANH["numba"] = dataclasses.replace(TANH["numba"], applies=_float32)
SIGMOID_GRAD = jit.variants(_sigmoid_grad, _grad_fused("sigmoid_grad"), no_workspace,
                            "dy * y * (1 - y) in one compiled pass")
TANH_GRAD = jit.variants(_tanh_grad, _grad_fused("tanh_grad"), no_workspace,
                         "dy * (1 - y^2) in one compiled pass")
RELU_GRAD = jit.variants(_relu_grad, _grad_fused("relu_grad"), no_workspace,
                         "dy * sign(y) in one compiled pass")


def _leaky_relu_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx, a = k.xp, k.ins, k.outs[0], float(k.attrs["alpha"])
    pos = k.scratch(0, x.shape, "bool")

    def step() -> None:
        xp.greater(x, 0, out=pos)
        xp.multiply(dy, a, out=dx)
        xp.copyto(dx, dy, where=pos)

    return step


def _elu_grad(k: KernelArgs) -> Step:
    xp, (x, y, dy), dx, a = k.xp, k.ins, k.outs[0], float(k.attrs["alpha"])
    pos = k.scratch(0, x.shape, "bool")

    def step() -> None:
        xp.add(y, a, out=dx)
        xp.multiply(dx, dy, out=dx)
        xp.greater(x, 0, out=pos)
        xp.copyto(dx, dy, where=pos)

    return step


# -- gradient rules --------------------------------------------------------------------


def _g_neg(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Neg", g[0])] if g[0] else [None]


def _g_abs(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Mul", g[0], gb.op("Sign", n.inputs[0]))] if g[0] else [None]


def _g_exp(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Mul", g[0], n.outputs[0])] if g[0] else [None]


def _g_log(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Div", g[0], n.inputs[0])] if g[0] else [None]


def _g_sqrt(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    half = gb.const(0.5, like=n.outputs[0])
    return [gb.op("Mul", gb.op("Div", g[0], n.outputs[0]), half)]


def _g_square(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    two = gb.const(2.0, like=n.inputs[0])
    return [gb.op("Mul", gb.op("Mul", g[0], n.inputs[0]), two)]


def _g_sin(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Mul", g[0], gb.op("Cos", n.inputs[0]))] if g[0] else [None]


def _g_cos(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("Neg", gb.op("Mul", g[0], gb.op("Sin", n.inputs[0])))] if g[0] else [None]


def _g_identity(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [g[0]]


def _g_zero(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    # Piecewise constant (Sign): the derivative is zero almost everywhere.
    return [None for _ in n.inputs]


def _g_by_output(grad_op: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        return [gb.op(grad_op, n.outputs[0], g[0], **n.attrs)] if g[0] else [None]

    return rule


def _g_by_input(grad_op: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        return [gb.op(grad_op, n.inputs[0], g[0], **n.attrs)] if g[0] else [None]

    return rule


def _g_elu(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("EluGrad", n.inputs[0], n.outputs[0], g[0], **n.attrs)] if g[0] else [None]


def _g_add(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    return [unbroadcast(gb, g[0], n.inputs[0]), unbroadcast(gb, g[0], n.inputs[1])]


def _g_sub(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    return [unbroadcast(gb, g[0], n.inputs[0]), gb.op("Neg", unbroadcast(gb, g[0], n.inputs[1]))]


def _g_mul(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    a, b = n.inputs
    return [
        unbroadcast(gb, gb.op("Mul", g[0], b), a),
        unbroadcast(gb, gb.op("Mul", g[0], a), b),
    ]


def _g_div(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    a, b = n.inputs
    da = gb.op("Div", g[0], b)
    # d(a/b)/db = -(a/b)/b = -y/b
    db = gb.op("Neg", gb.op("Mul", da, n.outputs[0]))
    return [unbroadcast(gb, da, a), unbroadcast(gb, db, b)]


def _sum_to_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    dst = tuple(attrs["shape"])
    if sum_to_axes(src, dst) != tuple(attrs["axes"]):
        raise ShapeError(f"SumTo: {src} does not reduce to {dst} over axes {attrs['axes']}")
    return [TensorDesc(ins[0].dtype, dst)]


def _sum_to(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axes = tuple(k.attrs["axes"])
    keep = list(x.shape)
    for a in axes:
        keep[a] = 1
    y_kept = y.reshape(tuple(keep))
    return lambda: xp.sum(x, axis=axes, keepdims=True, out=y_kept)


def _sum_to_fused(k: KernelArgs, ks: Any) -> Step | None:
    # Summing leading axes (a bias gradient): the rows added one after the other into
    # the output, numpy's order for an axis-0 sum, without its per-call set-up.
    x, y = k.ins[0], k.outs[0]
    axes = tuple(k.attrs["axes"])
    lead = len(axes)
    if not lead or axes != tuple(range(lead)) or not x.flags.c_contiguous or \
            not y.flags.c_contiguous or x.dtype != y.dtype:
        return None
    rows = 1
    for d in x.shape[:lead]:
        rows *= int(d)
    if rows < 1 or y.size * rows != x.size:
        return None
    x2, y1, run = x.reshape(rows, y.size), y.reshape(-1), ks.column_sums
    return lambda: run(x2, y1)


def _rows_in(k: KernelArgs) -> int:
    return int(k.ins[0].size)


SUM_TO = jit.variants(_sum_to, _sum_to_fused, no_workspace,
                      "leading axes summed row by row in one compiled loop")


def _g_sum_to(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    # Broadcasting back is adding a zero of the source shape: Expand via Add.
    return [gb.op("Expand", g[0], n.inputs[0])] if g[0] else [None]


def _expand_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [TensorDesc(ins[0].dtype, broadcast_shapes(ins[0].shape, ins[1].shape))]


def _expand(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    if x.shape == y.shape:
        return copy_step(xp, y, x)
    return lambda: xp.copyto(y, x)


def _g_expand(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [unbroadcast(gb, g[0], n.inputs[0]), None] if g[0] else [None, None]


def binary_kernel(name: str) -> Any:
    def factory(k: KernelArgs) -> Step:
        f = getattr(k.xp, name)
        a, b, y = k.ins[0], k.ins[1], k.outs[0]
        return lambda: f(a, b, out=y)

    return factory


def _div(k: KernelArgs) -> Step:
    xp, a, b, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    if y.dtype.kind in "iu":  # the float quotient cast back truncates toward zero
        return lambda: xp.divide(a, b, out=y, casting="unsafe")
    return lambda: xp.divide(a, b, out=y)


def _unary(name: str, ufunc: str, grad: Any, doc: str, float_only: bool = True,
           onnx: OnnxForm | None = None) -> OpDef:
    return OpDef(name=name, shape=float_unary_shape if float_only else unary_shape,
                 kernel=_ufunc_kernel(ufunc), grad=grad, inplace=(0,), flops=per_output(1),
                 stacking=StackRule.ELEMENTWISE, onnx=onnx or OnnxForm(name=name), doc=doc)


def _export_square(n: Node, helper: Any, nh: Any) -> Exported:
    return [helper.make_node("Mul", [n.inputs[0], n.inputs[0]], list(n.outputs))], []


ACTIVATION_KERNELS = {"Relu": _relu, "Sigmoid": _sigmoid, "Tanh": _ufunc_kernel("tanh")}
"""numpy kernels of the activations whose gradient reads only their output (fusable)."""

ACTIVATION_DEFAULTS = {"Relu": _relu, "Sigmoid": jit.by_size("Sigmoid", SIGMOID),
                       "Tanh": jit.by_size("Tanh", TANH)}
"""The same activations' default kernels: the compiled one where it applies (for an op
that runs its activation itself and has no variants of its own)."""

OPS = [
    _unary("Neg", "negative", _g_neg, "y = -x", float_only=False),
    _unary("Abs", "absolute", _g_abs, "y = |x|", float_only=False),
    _unary("Exp", "exp", _g_exp, "y = exp(x)"),
    _unary("Log", "log", _g_log, "y = log(x)"),
    _unary("Sqrt", "sqrt", _g_sqrt, "y = sqrt(x)"),
    _unary("Square", "square", _g_square, "y = x * x (not in ONNX: Mul(x, x) there)",
           onnx=OnnxForm(name="Mul", export=_export_square, imports=False)),
    _unary("Sin", "sin", _g_sin, "y = sin(x)"),
    _unary("Cos", "cos", _g_cos, "y = cos(x)"),
    _unary("Sign", "sign", _g_zero, "y = sign(x)", float_only=False),
    OpDef(name="Identity", shape=unary_shape, kernel=_expand, grad=_g_identity, inplace=(0,),
          flops=no_flops,
          stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Identity"), doc="y = x"),
    OpDef(name="Tanh", shape=float_unary_shape, kernel=jit.by_size("Tanh", TANH),
          flops=per_output(1), variants=TANH, grad=_g_by_output("TanhGrad"), inplace=(0,),
          stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Tanh"), doc="y = tanh(x)"),
    OpDef(name="Relu", shape=float_unary_shape, kernel=_relu, grad=_g_by_output("ReluGrad"),
          flops=per_output(1),
          inplace=(0,), stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Relu"),
          doc="max(x, 0)"),
    OpDef(name="Sigmoid", shape=float_unary_shape, kernel=jit.by_size("Sigmoid", SIGMOID),
          flops=per_output(1),
          variants=SIGMOID, grad=_g_by_output("SigmoidGrad"), inplace=(0,),
          stacking=StackRule.ELEMENTWISE,
          onnx=OnnxForm(name="Sigmoid"), doc="1 / (1 + exp(-x))"),
    OpDef(name="LeakyRelu", shape=float_unary_shape, kernel=_leaky_relu,
          flops=per_output(1),
          grad=_g_by_input("LeakyReluGrad"), attrs={"alpha": 0.01}, stacking=StackRule.ELEMENTWISE,
          onnx=OnnxForm(name="LeakyRelu"), doc="x if x > 0 else alpha * x"),
    OpDef(name="Elu", shape=float_unary_shape, kernel=_elu, grad=_g_elu, workspace=_ws_same,
          flops=per_output(1),
          attrs={"alpha": 1.0}, stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Elu"),
          doc="x if x > 0 else alpha * (exp(x) - 1)"),
    OpDef(name="Add", shape=binary_shape, kernel=binary_kernel("add"), grad=_g_add,
          flops=per_output(1),
          inplace=(0, 1), num_inputs=(2, 2), stacking=StackRule.BROADCAST,
          onnx=OnnxForm(name="Add"), doc="a + b, broadcasting"),
    OpDef(name="Sub", shape=binary_shape, kernel=binary_kernel("subtract"), grad=_g_sub,
          flops=per_output(1),
          inplace=(0, 1), num_inputs=(2, 2), stacking=StackRule.BROADCAST,
          onnx=OnnxForm(name="Sub"), doc="a - b, broadcasting"),
    OpDef(name="Mul", shape=binary_shape, kernel=binary_kernel("multiply"), grad=_g_mul,
          flops=per_output(1),
          inplace=(0, 1), num_inputs=(2, 2), stacking=StackRule.BROADCAST,
          onnx=OnnxForm(name="Mul"), doc="a * b, broadcasting"),
    OpDef(name="Div", shape=binary_shape, kernel=_div, grad=_g_div, inplace=(0, 1),
          flops=per_output(1),
          num_inputs=(2, 2), stacking=StackRule.BROADCAST, onnx=OnnxForm(name="Div"),
          doc="a / b, broadcasting (integers: truncated toward zero, as ONNX says)"),
    OpDef(name="SumTo", shape=_sum_to_shape, kernel=jit.by_size("SumTo", SUM_TO, _rows_in),
          flops=per_input(1),
          variants=SUM_TO, grad=_g_sum_to, num_inputs=(1, 1),
          attrs={"axes": (), "shape": ()}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: sum over broadcast axes to a smaller shape "
              "(the gradient of broadcasting)"),
    OpDef(name="Expand", shape=_expand_shape, kernel=_expand, grad=_g_expand, num_inputs=(2, 2),
          flops=no_flops,
          stacking=NOT_STACKED,
          onnx=EngineInternal("ONNX's Expand reads its shape input's values, this one its shape"),
          doc="broadcast input 0 to the shape of input 1 (the shape input is not read)"),
    # Gradient ops: fused like onnxruntime's training ops.
    OpDef(name="SigmoidGrad", shape=grad_like_second,
          flops=per_output(3),
          kernel=jit.by_size("SigmoidGrad", SIGMOID_GRAD), variants=SIGMOID_GRAD,
          grad=FIRST_ORDER_ONLY,
          num_inputs=(2, 2), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy * y * (1 - y)"),
    OpDef(name="TanhGrad", shape=grad_like_second, kernel=jit.by_size("TanhGrad", TANH_GRAD),
          flops=per_output(3),
          variants=TANH_GRAD, grad=FIRST_ORDER_ONLY,
          inplace=(0,), num_inputs=(2, 2), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy * (1 - y^2)"),
    OpDef(name="ReluGrad", shape=grad_like_second, kernel=jit.by_size("ReluGrad", RELU_GRAD),
          flops=per_output(1),
          variants=RELU_GRAD, grad=FIRST_ORDER_ONLY,
          inplace=(0,), num_inputs=(2, 2), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy * (y > 0)"),
    OpDef(name="LeakyReluGrad", shape=grad_like_second, kernel=_leaky_relu_grad,
          flops=per_output(1),
          grad=FIRST_ORDER_ONLY, workspace=_ws_bool_mask, num_inputs=(2, 2), attrs={"alpha": 0.01},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy if x > 0 else alpha * dy"),
    OpDef(name="EluGrad", shape=grad_like_second, kernel=_elu_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(2),
          workspace=_ws_bool_mask, num_inputs=(3, 3), attrs={"alpha": 1.0},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy if x > 0 else dy * (y + alpha)"),
]
