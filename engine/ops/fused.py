"""Fused ops the graph optimiser produces: ``FusedGemm`` is a Linear layer and its
activation in one instruction (onnxruntime's ``com.microsoft.FusedGemm``).

The activation runs in place on the Gemm's output, so the pre-activation is never
stored; the gradient reads only the activation's output, which is why only
activations whose derivative is a function of their output are fused.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    MADE_AFTER_STACKING,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
)
from engine.ops._onnx import ENGINE_INTERNAL
from engine.ops.elementwise import ACTIVATION_KERNELS
from engine.ops.linalg import GEMM_ATTRS, _g_gemm, _gemm, _gemm_shape, _gemm_ws

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


def _fused(k: KernelArgs) -> Step:
    gemm = _gemm(k)
    y = k.outs[0]
    act = ACTIVATION_KERNELS[k.attrs["activation"]](
        KernelArgs(k.xp, [y], [y], k.ws, {}, k.rng, k.device))

    def step() -> None:
        gemm()
        act()

    return step


def _g_fused(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    dz = gb.op(f"{n.attrs['activation']}Grad", n.outputs[0], g[0])
    return _g_gemm(gb, NodeView("Gemm", n.inputs, n.outputs, gemm_attrs(n.attrs)), [dz])


OPS = [
    OpDef(name="FusedGemm", shape=_fused_shape, kernel=_fused, grad=_g_fused, workspace=_gemm_ws,
          num_inputs=(2, 3), attrs={**GEMM_ATTRS, "activation": "Relu"},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="activation(alpha * A' @ B' + beta * C): a Linear layer and its activation "
              "(Relu, Sigmoid or Tanh) in one instruction"),
]
