"""Comparisons and logical not: ``Equal``, ``Less``, ``LessOrEqual``, ``Greater``,
``GreaterOrEqual`` (two operands of one element type, broadcasting, a ``bool`` result)
and ``Not`` (of a ``bool``), as ONNX defines them.

They make the masks a model computes from its own tensors: nanoGPT's causal mask,
``bias[:, :, :T, :T] == 0``, feeds ``Where`` (``masked_fill``), which sends no gradient
to its condition.  No gradient flows through a comparison: a parameter on a path
ahead of the loss through one (``h * (h > 0).to("float32")``) gets none from it, as in
PyTorch: a comparison is a step, flat almost everywhere.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 3))
>>> zero = g.constant([0.0], shape=(), name="zero")
>>> p = g.path("infer", Mode.FORWARD_ONLY)
>>> m = p.Not(p.Greater(x, zero))
>>> vm = VM(compile_graph(g, batch_size=2, keep=[m.name]))
>>> vm.set("x", np.array([[-1.0, 0.0, 2.0], [3.0, -4.0, 0.5]], np.float32))
>>> vm.forward("infer"); vm.get(m.name).tolist()
[[True, True, False], [False, True, False]]
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.graph import DType, TensorDesc
from engine.ops._base import (
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    broadcast_shapes,
    per_output,
    same_dtype,
)
from engine.ops._onnx import OnnxForm
from engine.ops.elementwise import binary_kernel


def no_gradient(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    """A boolean output: zero gradient to every input, as PyTorch treats comparisons."""
    return [None] * len(n.inputs)


def _compare_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    same_dtype(ins, "compared values")
    return [TensorDesc(DType.BOOL, broadcast_shapes(ins[0].shape, ins[1].shape))]


def _not_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if ins[0].dtype != DType.BOOL:
        raise ShapeError(f"Not takes a bool tensor, got {ins[0].dtype.value}")
    return [ins[0]]


def _not(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    return lambda: xp.logical_not(x, out=y)


def _comparison(name: str, ufunc: str, says: str) -> OpDef:
    return OpDef(name=name, shape=_compare_shape, kernel=binary_kernel(ufunc),
                 grad=no_gradient, flops=per_output(1), num_inputs=(2, 2),
                 stacking=StackRule.BROADCAST, onnx=OnnxForm(name=name),
                 doc=f"ONNX {name}: a {says} b, broadcasting (bool)")


OPS = [
    _comparison("Equal", "equal", "=="),
    _comparison("Less", "less", "<"),
    _comparison("LessOrEqual", "less_equal", "<="),
    _comparison("Greater", "greater", ">"),
    _comparison("GreaterOrEqual", "greater_equal", ">="),
    OpDef(name="Not", shape=_not_shape, kernel=_not, grad=no_gradient,
          flops=per_output(1), stacking=StackRule.ELEMENTWISE, onnx=OnnxForm(name="Not"),
          doc="ONNX Not: logical not of a bool tensor"),
]
