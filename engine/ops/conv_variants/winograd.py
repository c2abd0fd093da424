"""``winograd``: F(2x2, 3x3) for 3x3 kernels at stride and dilation 1 and one group
(:func:`engine.ops.conv_algorithms.winograd`)."""

from __future__ import annotations

from typing import Any

from engine.graph import TensorDesc
from engine.ops import conv_algorithms as algorithms
from engine.ops._base import KernelArgs, Step, Variant
from engine.ops.conv import conv_geometry


def _ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    geo = conv_geometry(ins[0].shape, ins[1].shape, attrs)
    return algorithms.winograd_ws(ins[0].shape, geo, ins[0].dtype.itemsize)


def _kernel(k: KernelArgs) -> Step:
    geo = conv_geometry(tuple(k.ins[0].shape), tuple(k.ins[1].shape), k.attrs)
    return algorithms.winograd(k, geo)


def _applies(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    geo = conv_geometry(ins[0].shape, ins[1].shape, attrs)
    return geo["k"] == (3, 3) and geo["s"] == (1, 1) and geo["d"] == (1, 1) and \
        geo["group"] == 1


VARIANT = Variant(applies=_applies, workspace=_ws, kernel=_kernel,
                  doc="F(2x2, 3x3) needs a 3x3 kernel, stride and dilation 1 and one group")
