"""``Resize`` (ONNX) as nearest-neighbour upsampling by whole factors: each element
repeated ``factors[i]`` times along axis ``i``, what PyTorch's ``Upsample``/
``interpolate(mode="nearest", scale_factor=k)`` write and U-Nets and FPNs use.

Imported, a Resize node's scales (or constant sizes), coordinate transformation and
rounding are checked to pick exactly those source elements; any other form (linear or
cubic modes, downsampling, fractional factors, regions of interest) is refused with
:class:`~engine.errors.UnsupportedForm`, naming what it asked.  The gradient sums each
block of copies back (a view as ``[..., d_i, f_i, ...]`` and a sum over the ``f_i``).

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (0, 1, 2))
>>> g.output(g.path("up", Mode.FORWARD_ONLY).Resize(x, factors=(1, 1, 2), outputs=["y"]))
>>> vm = VM(compile_graph(g, batch_size=1)); vm.set("x", np.array([[[1, 2]]], np.float32))
>>> vm.forward("up"); vm.get("y").tolist()
[[[1.0, 1.0, 2.0, 2.0]]]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import GraphError, ShapeError, UnsupportedForm
from engine.graph import BATCH, Node, TensorDesc
from engine.ops._base import (
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    no_flops,
)
from engine.ops._onnx import Exported, ImportContext, OnnxForm

NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _factors(x: TensorDesc, attrs: dict[str, Any]) -> tuple[int, ...]:
    factors = tuple(int(f) for f in attrs["factors"])
    if len(factors) != len(x.shape) or any(f < 1 for f in factors):
        raise ShapeError(f"Resize: factors {factors} must be whole numbers >= 1, one per "
                         f"axis of {x.shape}")
    if x.batched and factors[0] != 1:
        raise ShapeError(f"Resize: the batch axis cannot be resized (factors {factors})")
    return factors


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    factors = _factors(x, attrs)
    return [TensorDesc(x.dtype, tuple(d if d == BATCH else d * f
                                      for d, f in zip(x.shape, factors, strict=True)))]


def _blocked(shape: tuple[int, ...], factors: tuple[int, ...]) -> tuple[int, ...]:
    """The output's shape as ``[d_0, f_0, d_1, f_1, ...]`` (0 keeps the batch)."""
    return tuple(v for d, f in zip(shape, factors, strict=True) for v in (d, f))


def _kernel(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    factors = tuple(int(f) for f in k.attrs["factors"])
    blocks = y.reshape(_blocked(x.shape, factors))
    source = x.reshape(_blocked(x.shape, (1,) * x.ndim))  # a view: each element, once
    return lambda: xp.copyto(blocks, source)  # broadcast over the copies, no temporary


def _grad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    shape = gb.desc(n.inputs[0]).shape
    factors = tuple(int(f) for f in n.attrs["factors"])
    blocked = gb.op("Reshape", g[0], shape=_blocked(shape, factors))
    return [gb.op("ReduceSum", blocked, axes=tuple(range(1, 2 * len(shape), 2)), keepdims=0)]


def _source(x: int, s: int, n_in: int, transform: str, rounding: str) -> int:
    """The input index ONNX's nearest Resize reads for output index ``x`` (scale ``s``)."""
    n_out = n_in * s
    if transform in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        # half_pixel_symmetric's centring adjustment is 0 where the output is the input
        # times a whole factor, the only resize taken here
        v = (x + 0.5) / s - 0.5 if n_out > 1 or transform == "half_pixel" else 0.0
    elif transform == "asymmetric":
        v = x / s
    elif transform == "tf_half_pixel_for_nn":
        v = (x + 0.5) / s
    elif transform == "align_corners":
        v = x * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        raise UnsupportedForm(f"Resize: coordinate_transformation_mode {transform!r} is not "
                              "supported")
    low = math.floor(v)
    frac = v - low
    if rounding == "floor":
        i = low
    elif rounding == "ceil":
        i = math.ceil(v)
    elif rounding == "round_prefer_floor":
        i = low if frac <= 0.5 else low + 1
    else:
        i = low if frac < 0.5 else low + 1
    return min(max(i, 0), n_in - 1)


def _import(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
            ) -> tuple[list[str], dict[str, Any]]:
    """A Resize node's inputs and attributes as the engine's: ``factors`` from its
    constant scales or sizes; UnsupportedForm for what nearest repetition is not."""
    where = f"node {node.name or node.output[0]!r} (Resize)"
    mode = str(attrs.get("mode", "nearest"))
    if mode != "nearest":
        raise UnsupportedForm(f"{where}: mode {mode!r} is not supported: nearest "
                              "upsampling by whole factors only")
    positions = list(node.input)
    shape = ctx.shapes.get(positions[0])
    if shape is None:
        raise GraphError(f"{where}: the rank of its input is unknown")
    if ctx.opset < 11:  # X, scales; the coordinates of Upsample
        scales_name, sizes_name = [*positions, ""][1], ""
        transform, rounding = "asymmetric", "floor"
    else:  # X, roi (read by tf_crop_and_resize alone), scales, sizes
        scales_name, sizes_name = [*positions, "", "", ""][2:4]
        transform = str(attrs.get("coordinate_transformation_mode", "half_pixel"))
        rounding = str(attrs.get("nearest_mode", "round_prefer_floor"))
    if rounding not in NEAREST_MODES:
        raise UnsupportedForm(f"{where}: nearest_mode {rounding!r} is not supported")
    rank = len(shape)
    axes = [int(a) % rank if -rank <= int(a) < rank else rank
            for a in attrs.get("axes") or range(rank)]
    if rank in axes or len(set(axes)) != len(axes):
        raise ShapeError(f"{where}: axes {attrs.get('axes')} for an input of rank {rank}")
    if scales_name and ctx.is_const(scales_name) and ctx.const(scales_name, node).size:
        given = [float(v) for v in ctx.const(scales_name, node).reshape(-1)]
    elif sizes_name:
        sizes = [int(v) for v in ctx.const(sizes_name, node).reshape(-1)]
        if len(sizes) != len(axes):
            raise ShapeError(f"{where}: {len(sizes)} sizes for {len(axes)} axes")
        given = [1.0 if shape[a] == BATCH and a == 0 and ctx.batch else
                 size / shape[a] if shape[a] else math.nan for a, size in zip(axes, sizes,
                                                                                strict=True)]
        policy = str(attrs.get("keep_aspect_ratio_policy", "stretch"))
        if policy in ("not_larger", "not_smaller"):  # one scale for every axis named
            one = (min if policy == "not_larger" else max)(given)
            given = [one] * len(given)
        elif policy != "stretch":
            raise UnsupportedForm(f"{where}: keep_aspect_ratio_policy {policy!r}")
    else:
        raise UnsupportedForm(f"{where}: its scales or sizes must be constants")
    if len(given) != len(axes):
        raise ShapeError(f"{where}: {len(given)} scales for {len(axes)} axes of an input "
                         f"of rank {rank}")
    ratios = [1.0] * rank
    for a, r in zip(axes, given, strict=True):
        ratios[a] = r
    factors = []
    for axis, r in enumerate(ratios):
        f = round(r) if np.isfinite(r) else 0
        if f < 1 or abs(r - f) > 1e-6:
            raise UnsupportedForm(f"{where}: scale {r:g} on axis {axis} is not supported: "
                                  "nearest upsampling by whole factors only")
        n_in = shape[axis] or 5  # an unknown length: the pattern repeats from any
        if f > 1 and any(_source(i, f, n_in, transform, rounding) != i // f
                         for i in range(n_in * f)):
            raise UnsupportedForm(f"{where}: {transform} coordinates with {rounding} "
                                  "rounding do not repeat each element; not supported")
        factors.append(f)
    return [positions[0]], {"factors": tuple(factors)}


def _export(n: Node, helper: Any, nh: Any) -> Exported:
    """Nearest, asymmetric coordinates, floor: element ``i // f``, exactly."""
    y = n.outputs[0]
    scales = nh.from_array(np.array(n.attrs["factors"], np.float32), f"{y}_scales")
    return [helper.make_node("Resize", [n.inputs[0], "", scales.name], [y], mode="nearest",
                             coordinate_transformation_mode="asymmetric",
                             nearest_mode="floor")], [scales]


OPS = [
    OpDef(name="Resize", shape=_shape, kernel=_kernel, grad=_grad, flops=no_flops,
          attrs={"factors": ()}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Resize", import_=_import, export=_export, needs_shapes=True,
                        attr_inputs=(1, 2, 3)),
          doc="nearest-neighbour upsampling: each element repeated factors[i] times "
              "along axis i"),
]
