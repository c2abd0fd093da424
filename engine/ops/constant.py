"""``ConstantOfShape`` (ONNX): a tensor of one value.

The importer folds it when its shape is known (as it is in models whose weights it
generates), so it usually becomes a parameter with a constant init; the op remains for
graphs that build one themselves.

>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> y = g.path("make", Mode.FORWARD_ONLY).ConstantOfShape(shape=(2, 3), value=1.5)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name])); vm.forward("make")
>>> vm.get(y.name).tolist()
[[1.5, 1.5, 1.5], [1.5, 1.5, 1.5]]
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    NO_INPUTS,
    NOT_STACKED,
    KernelArgs,
    OpDef,
    Step,
    no_flops,
)
from engine.ops._onnx import OnnxForm
from engine.ops.cast import target_dtype

MAX_ELEMENTS = 1 << 34  # a shape beyond this is an error, not an allocation attempt


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    shape = tuple(int(d) for d in attrs["shape"])
    if any(d < 0 for d in shape):
        raise ShapeError(f"ConstantOfShape: negative dimension in {shape}")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_ELEMENTS:
        raise ShapeError(f"ConstantOfShape: shape {shape} has {n:,} elements (more than "
                         f"{MAX_ELEMENTS:,})")
    return [TensorDesc(target_dtype(attrs["dtype"]), shape)]


def _kernel(k: KernelArgs) -> Step:
    y, value = k.outs[0], k.attrs["value"]
    return lambda: y.fill(value)


OPS = [
    OpDef(name="ConstantOfShape", shape=_shape, kernel=_kernel, grad=NO_INPUTS, num_inputs=(0, 0),
          flops=no_flops,
          attrs={"shape": (), "value": 0.0, "dtype": "float32"}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="ConstantOfShape", exports=False, attr_inputs=(0,)),
          doc="ONNX ConstantOfShape with its shape as an attribute: `value` everywhere"),
]
