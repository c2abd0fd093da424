"""``direct``: one GEMM per kernel position into an accumulator; its workspace is one
position's input, not all kH·kW of them (:func:`engine.ops.conv_algorithms.direct`)."""

from __future__ import annotations

from typing import Any

from engine.graph import TensorDesc
from engine.ops import conv_algorithms as algorithms
from engine.ops._base import KernelArgs, Step, Variant
from engine.ops.conv import conv_geometry, padded_copy


def _ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    geo = conv_geometry(ins[0].shape, ins[1].shape, attrs)
    return algorithms.direct_ws(ins[0].shape, geo, ins[0].dtype.itemsize)


def _kernel(k: KernelArgs) -> Step:
    x = k.ins[0]
    geo = conv_geometry(tuple(x.shape), tuple(k.ins[1].shape), k.attrs)
    return algorithms.direct(k, geo, *padded_copy(k.xp, x, k.ws, geo, 0, 0.0))


def _applies(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return True


VARIANT = Variant(applies=_applies, workspace=_ws, kernel=_kernel,
                  doc="one GEMM per kernel position, summed into an accumulator")
