"""Fused ops the graph optimiser produces: ``FusedGemm`` is a Linear layer and its
activation in one instruction (onnxruntime's ``com.microsoft.FusedGemm``).

The activation runs in place on the Gemm's output, so the pre-activation is never
stored; the gradient reads only the activation's output, which is why only
activations whose derivative is a function of their output are fused.

The ``"numba"`` variant (:mod:`engine.ops.jit`) adds the bias inside the activation's
first pass: Relu's ``max(y + b, 0)`` is one pass instead of two; Sigmoid and Tanh are
one pass around a rational tanh in float32.  In float64 Sigmoid's numpy tanh sits
between two compiled passes and Tanh is the Gemm, then numpy's tanh.  Where the bias is
not one row (or there is none), the Gemm runs, then the activation's own compiled
kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops import jit
from engine.ops._base import (
    MADE_AFTER_STACKING,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
)
from engine.ops._onnx import ENGINE_INTERNAL
from engine.ops.elementwise import ACTIVATION_DEFAULTS, ACTIVATION_KERNELS
from engine.ops.linalg import GEMM_ATTRS, _g_gemm, _gemm, _gemm_shape, _gemm_ws, _t, gemm_flops

FUSABLE_ACTIVATIONS = tuple(sorted(ACTIVATION_KERNELS))
"""Activations whose gradient is a function of their output: Relu, Sigmoid, Tanh."""


def gemm_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """The plain Gemm attributes of a FusedGemm."""
    return {k: attrs[k] for k in GEMM_ATTRS}


def _fused_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if attrs["activation"] not in ACTIVATION_KERNELS:
        raise ShapeError(f"FusedGemm: activation {attrs['activation']!r} is not one of "
                         f"{', '.join(FUSABLE_ACTIVATIONS)}")
    return _gemm_shape(ins, attrs)


def _fused(k: KernelArgs, table: dict[str, Any] = ACTIVATION_KERNELS) -> Step:
    gemm = _gemm(k)
    y = k.outs[0]
    act = table[k.attrs["activation"]](KernelArgs(k.xp, [y], [y], k.ws, {}, k.rng, k.device))

    def step() -> None:
        gemm()
        act()

    return step


def _fused_bias_act(k: KernelArgs, ks: Any) -> Step | None:
    # The bias in the activation's pass: A' @ B' + C with C one row (a Linear layer's
    # bias), a contiguous output, Relu, Sigmoid or (float32) Tanh.  Any other form runs
    # the Gemm, then the activation's default kernel (compiled where it applies).
    act, attrs = k.attrs["activation"], k.attrs
    y = k.outs[0]
    if act not in ("Relu", "Sigmoid", "Tanh") or len(k.ins) != 3 or \
            float(attrs["alpha"]) != 1.0 or float(attrs["beta"]) != 1.0 or y.ndim != 2 or \
            not y.flags.c_contiguous:
        return _fused(k, ACTIVATION_DEFAULTS)
    c = k.ins[2]
    if c.size != y.shape[1] or (c.ndim == 2 and c.shape[0] != 1) or not c.flags.c_contiguous \
            or c.dtype != y.dtype:
        return _fused(k, ACTIVATION_DEFAULTS)
    xp, b = k.xp, c.reshape(-1)
    a, w = _t(xp, k.ins[0], attrs["transA"]), _t(xp, k.ins[1], attrs["transB"])
    if act == "Relu":
        bias_relu = ks.bias_relu

        def relu() -> None:
            xp.matmul(a, w, out=y)
            bias_relu(y, b)

        return relu
    if y.dtype == np.float32:
        run = ks.bias_sigmoid if act == "Sigmoid" else ks.bias_tanh

        def activate() -> None:
            xp.matmul(a, w, out=y)
            run(y, b)

        return activate
    if act == "Tanh":  # float64: numpy's tanh, so the plain kernel
        return _fused(k)
    pre, post, flat = ks.bias_half, ks.half_plus_half, y.reshape(-1)

    def sigmoid() -> None:
        xp.matmul(a, w, out=y)
        pre(y, b)
        xp.tanh(y, out=y)
        post(flat)

    return sigmoid


VARIANTS = jit.variants(_fused, _fused_bias_act, _gemm_ws,
                        "the bias added in the activation's compiled pass (Relu, Sigmoid, "
                        "and Tanh in float32)")


def _flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The Gemm's, and its activation's 1 per output element."""
    return gemm_flops(ins, outs, attrs) + outs[0].numel()


def _outputs(k: KernelArgs) -> int:
    return int(k.outs[0].size)


def _g_fused(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    dz = gb.op(f"{n.attrs['activation']}Grad", n.outputs[0], g[0])
    return _g_gemm(gb, NodeView("Gemm", n.inputs, n.outputs, gemm_attrs(n.attrs)), [dz])


OPS = [
    OpDef(name="FusedGemm", shape=_fused_shape, kernel=jit.by_size("FusedGemm", VARIANTS, _outputs),
          flops=_flops,
          variants=VARIANTS, grad=_g_fused, workspace=_gemm_ws,
          num_inputs=(2, 3), attrs={**GEMM_ATTRS, "activation": "Relu"},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="activation(alpha * A' @ B' + beta * C): a Linear layer and its activation "
              "(Relu, Sigmoid or Tanh) in one instruction"),
]
