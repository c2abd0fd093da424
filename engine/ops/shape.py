"""Shape operators: the views (``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``: the
input's bytes in another shape, free when planned in the input's memory), ``Concat``,
``Split`` and ``Transpose``.

The batch dimension must stay the leading axis of every tensor (so that a smaller
last mini-batch is a prefix of the same buffer); a reshape that would merge it with
another axis is rejected with a clear error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError, ZeroSizeError
from engine.graph import BATCH, Node, TensorDesc
from engine.ops._base import (
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    copy_step,
    no_flops,
    norm_axis,
)
from engine.ops._onnx import Exported, ImportContext, OnnxForm, export_axes, import_axes


def _prod(dims: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _reshape_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    target = [int(d) for d in attrs["shape"]]
    if attrs.get("allowzero") and 0 in target:
        raise ZeroSizeError(f"Reshape to {tuple(target)} with allowzero: a zero-size dimension")
    batched = ins[0].batched
    if target.count(-1) > 1:
        raise ShapeError(f"Reshape: at most one -1 in the target shape {tuple(target)}")
    out: list[int] = []
    for i, d in enumerate(target):
        if d == 0:
            if i >= len(src):
                raise ShapeError(f"Reshape: target {tuple(target)} copies axis {i} of {src}")
            out.append(src[i])
        else:
            out.append(d)
    if batched and (not out or out[0] != BATCH or target[0] != 0):
        raise ShapeError(
            f"Reshape {src} -> {tuple(target)} would move the batch dimension; "
            "keep it leading by giving 0 as the first target dimension"
        )
    rest_src = _prod(src[1:]) if batched else _prod(src)
    fixed = [d for i, d in enumerate(out) if d != -1 and not (batched and i == 0)]
    known = _prod(fixed)
    if -1 in out:
        if known == 0 or rest_src % known:
            raise ShapeError(f"Reshape: cannot infer -1 reshaping {src} to {tuple(target)}")
        out[out.index(-1)] = rest_src // known
    elif known != rest_src:
        raise ShapeError(f"Reshape: {src} has {rest_src} elements per sample, "
                         f"target {tuple(target)} has {known}")
    return [TensorDesc(ins[0].dtype, tuple(out))]


def _copy_reshaped(k: KernelArgs) -> Step:
    """A view op's kernel: nothing to do when the planner put the output in the input's
    bytes (:func:`copy_step` sees one address), else a copy."""
    return copy_step(k.xp, k.outs[0], k.ins[0].reshape(k.outs[0].shape))


def _g_reshape(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    return [gb.op("Reshape", g[0], shape=tuple(gb.desc(n.inputs[0]).shape))]


def _flatten_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    axis = int(attrs["axis"])
    if axis < 0:
        axis += len(src)
    if not 0 <= axis <= len(src):
        raise ShapeError(f"Flatten: axis {attrs['axis']} out of range for {src}")
    if ins[0].batched and axis != 1:
        raise ShapeError(f"Flatten(axis={axis}) of {src} would merge the batch dimension; "
                         "use axis=1")
    head = BATCH if ins[0].batched else _prod(src[:axis])
    return [TensorDesc(ins[0].dtype, (head, _prod(src[axis:])))]


def _squeeze_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    axes = {a % len(src) for a in attrs["axes"]} if attrs["axes"] else \
        {i for i, d in enumerate(src) if d == 1}
    if ins[0].batched and 0 in axes:
        raise ShapeError(f"Squeeze {tuple(attrs['axes'])} of {src} would drop the batch")
    bad = [a for a in axes if src[a] != 1]
    if bad:
        raise ShapeError(f"Squeeze: axes {sorted(bad)} of {src} are not of size 1")
    return [TensorDesc(ins[0].dtype, tuple(d for i, d in enumerate(src) if i not in axes))]


def _unsqueeze_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    rank = len(src) + len(attrs["axes"])
    axes = sorted({a % rank for a in attrs["axes"]})
    if len(axes) != len(attrs["axes"]):
        raise ShapeError(f"Unsqueeze: repeated axes {tuple(attrs['axes'])}")
    if ins[0].batched and 0 in axes:
        raise ShapeError(f"Unsqueeze {tuple(attrs['axes'])} of {src} would move the batch")
    out, it = [], iter(src)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return [TensorDesc(ins[0].dtype, tuple(out))]


def _concat_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    first = ins[0].shape
    axis = norm_axis(int(attrs["axis"]), len(first))
    if ins[0].batched and axis == 0:
        raise ShapeError("Concat along the batch axis would change the batch")
    total = 0
    for d in ins:
        if d.dtype != ins[0].dtype:
            raise ShapeError(f"Concat inputs have dtypes {ins[0].dtype.value} and {d.dtype.value}")
        if len(d.shape) != len(first) or any(a != b for i, (a, b) in
                                             enumerate(zip(d.shape, first, strict=True))
                                             if i != axis):
            raise ShapeError(f"Concat along axis {axis}: {d.shape} does not match {first}")
        total += d.shape[axis]
    return [TensorDesc(ins[0].dtype, (*first[:axis], total, *first[axis + 1:]))]


def _concat(k: KernelArgs) -> Step:
    xp, y = k.xp, k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), y.ndim)
    return _copies(xp, list(zip(_slabs(y, k.ins, axis), k.ins, strict=True)))


def _slabs(whole: Any, parts: list[Any], axis: int) -> list[Any]:
    """Views of ``whole`` along ``axis``, one per part, each as long as its part."""
    out, at = [], 0
    for part in parts:
        sl = [slice(None)] * whole.ndim
        sl[axis] = slice(at, at + part.shape[axis])
        out.append(whole[tuple(sl)])
        at += part.shape[axis]
    return out


def _copies(xp: Any, pairs: list[tuple[Any, Any]]) -> Step:
    def step() -> None:
        for dst, src in pairs:
            xp.copyto(dst, src)

    return step


def _g_concat(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    axis = int(n.attrs["axis"])
    sizes = tuple(gb.desc(x).shape[axis] for x in n.inputs)
    first = gb.op("Split", g[0], axis=axis, split=sizes)
    out: list[str | None] = [first]
    out.extend(f"{first}:{i}" for i in range(1, len(n.inputs)))
    return out


def split_sizes(attrs: dict[str, Any], length: int) -> tuple[int, ...]:
    """The parts of a Split of ``length`` (explicit sizes, or num_outputs near-equal parts
    with a smaller last one, as ONNX says)."""
    if attrs["split"]:
        sizes = tuple(int(s) for s in attrs["split"])
        if sum(sizes) != length:
            raise ShapeError(f"Split sizes {sizes} do not add up to {length}")
        return sizes
    parts = int(attrs["num_outputs"])
    if parts < 1:
        raise ShapeError("Split needs split sizes or num_outputs")
    size = -(-length // parts)
    return tuple(min(size, length - i * size) for i in range(parts))


def _split_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    axis = norm_axis(int(attrs["axis"]), len(src))
    if ins[0].batched and axis == 0:
        raise ShapeError("Split along the batch axis would change the batch")
    sizes = split_sizes(attrs, src[axis])
    if min(sizes) < 1:
        raise ZeroSizeError(f"Split into empty parts {sizes} is not supported")
    return [TensorDesc(ins[0].dtype, (*src[:axis], s, *src[axis + 1:])) for s in sizes]


def _split(k: KernelArgs) -> Step:
    xp, x = k.xp, k.ins[0]
    axis = norm_axis(int(k.attrs["axis"]), x.ndim)
    return _copies(xp, list(zip(k.outs, _slabs(x, k.outs, axis), strict=True)))


def _g_split(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not any(g):
        return [None]
    parts = [gi if gi else gb.op("Expand", gb.const(0.0, like=n.inputs[0]), out)
             for gi, out in zip(g, n.outputs, strict=True)]
    return [gb.op("Concat", *parts, axis=int(n.attrs["axis"]))]


def transpose_perm(attrs: dict[str, Any], rank: int) -> tuple[int, ...]:
    """The permutation of a Transpose (ONNX: reversed axes when ``perm`` is empty)."""
    perm = tuple(int(a) for a in attrs["perm"]) or tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of {rank} axes")
    return perm


def _transpose_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    src = ins[0].shape
    perm = transpose_perm(attrs, len(src))
    if ins[0].batched and perm[0] != 0:
        raise ShapeError(f"Transpose {perm} of {src} would move the batch dimension; "
                         "keep axis 0 first")
    return [TensorDesc(ins[0].dtype, tuple(src[a] for a in perm))]


def _transpose(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    xt = x.transpose(transpose_perm(k.attrs, x.ndim))
    return lambda: xp.copyto(y, xt)


def _g_transpose(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    perm = transpose_perm(n.attrs, len(gb.desc(n.inputs[0]).shape))
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return [gb.op("Transpose", g[0], perm=inverse)]


# -- ONNX forms: the target shape and the split sizes are ONNX inputs ---------------


def _import_reshape(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
                    ) -> tuple[list[str], dict[str, Any]]:
    target = [int(v) for v in ctx.const(ins[1], node)]
    # With a batch dimension, a leading dimension written as the model's batch size (or
    # -1) is the batch: 0 keeps it, as this engine requires.
    if ctx.batch and target and not ctx.is_const(ins[0]) and \
            target[0] in (-1, ctx.declared_batch) and len(target) > 1:
        target[0] = 0
    attrs["shape"] = tuple(target)
    return ins[:1], attrs


def _export_reshape(n: Node, helper: Any, nh: Any) -> Exported:
    shape = nh.from_array(np.asarray(n.attrs["shape"], dtype=np.int64), f"{n.outputs[0]}:shape")
    return [helper.make_node("Reshape", [n.inputs[0], shape.name], [n.outputs[0]])], [shape]


def _import_split(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
                  ) -> tuple[list[str], dict[str, Any]]:
    if len(ins) > 1:
        attrs["split"] = tuple(int(v) for v in ctx.const(ins[1], node))
    elif not attrs.get("num_outputs"):
        attrs["num_outputs"] = len(node.output)
    return ins[:1], attrs


def _export_split(n: Node, helper: Any, nh: Any) -> Exported:
    axis = int(n.attrs.get("axis", 0))
    if n.attrs.get("split"):
        t = nh.from_array(np.asarray(n.attrs["split"], dtype=np.int64), f"{n.outputs[0]}:split")
        return [helper.make_node("Split", [n.inputs[0], t.name], list(n.outputs),
                                 axis=axis)], [t]
    return [helper.make_node("Split", [n.inputs[0]], list(n.outputs), axis=axis)], []


OPS = [
    OpDef(name="Concat", shape=_concat_shape, kernel=_concat, grad=_g_concat, num_inputs=(1, 64),
          flops=no_flops,
          attrs={"axis": 0}, stacking=NOT_STACKED, onnx=OnnxForm(name="Concat"),
          doc="ONNX Concat (not along the batch axis)"),
    OpDef(name="Split", shape=_split_shape, kernel=_split, grad=_g_split, num_outputs=64,
          flops=no_flops,
          variadic_outputs=True, attrs={"axis": 0, "split": (), "num_outputs": 0},
          stacking=NOT_STACKED,
          onnx=OnnxForm(name="Split", export=_export_split, import_=_import_split,
                        attr_inputs=(1,)),
          doc="ONNX Split with sizes (or num_outputs) as attributes (not along the batch)"),
    OpDef(name="Squeeze", shape=_squeeze_shape, kernel=_copy_reshaped, grad=_g_reshape,
          flops=no_flops,
          inplace=(0,), view=True, attrs={"axes": ()}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Squeeze", export=export_axes, import_=import_axes, attr_inputs=(1,)),
          doc="ONNX Squeeze with axes as an attribute (all size-1 axes when empty)"),
    OpDef(name="Unsqueeze", shape=_unsqueeze_shape, kernel=_copy_reshaped, grad=_g_reshape,
          flops=no_flops,
          inplace=(0,), view=True, attrs={"axes": ()}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Unsqueeze", export=export_axes, import_=import_axes,
                        attr_inputs=(1,)),
          doc="ONNX Unsqueeze with axes as an attribute"),
    OpDef(name="Transpose", shape=_transpose_shape, kernel=_transpose, grad=_g_transpose,
          flops=no_flops,
          attrs={"perm": ()}, stacking=NOT_STACKED, onnx=OnnxForm(name="Transpose"),
          doc="ONNX Transpose: permute axes by perm (reversed when empty)"),
    OpDef(name="Reshape", shape=_reshape_shape, kernel=_copy_reshaped, grad=_g_reshape,
          flops=no_flops,
          inplace=(0,), view=True, attrs={"shape": (), "allowzero": 0},
          stacking=NOT_STACKED,
          onnx=OnnxForm(name="Reshape", export=_export_reshape, import_=_import_reshape,
                        attr_inputs=(1,)),
          doc="ONNX Reshape with the target shape as an attribute (0 copies, -1 infers)"),
    OpDef(name="Flatten", shape=_flatten_shape, kernel=_copy_reshaped, grad=_g_reshape,
          flops=no_flops,
          inplace=(0,), view=True, attrs={"axis": 1}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Flatten"),
          doc="ONNX Flatten: 2-D [prod(shape[:axis]), prod(shape[axis:])]"),
]
