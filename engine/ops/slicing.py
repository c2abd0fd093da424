"""Indexing ops: ``Slice``, ``Pad``, ``Gather`` and ``Shape`` (ONNX), with gradients.

Their index arguments (starts, ends, pads, ...) are attributes, as ONNX's constant
inputs become at import.  Each op is a copy through a strided view, so nothing is
allocated; the gradients scatter back through the same views:

- ``Slice``: ``dX`` is zero with ``dY`` in the sliced view;
- ``Pad``: the padding folded back onto the elements it copied (edge, reflect and wrap
  modes), then the inner view; in constant mode just the inner view;
- ``Gather``: ``dY`` added at the gathered indices (repeated indices add up).

A slice or pad may not touch a batched tensor's leading (batch) axis.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (2, 5))
>>> p = g.path("s", Mode.FORWARD_ONLY)
>>> y = p.Slice(x, starts=(4,), ends=(0,), axes=(1,), steps=(-2,))
>>> z = p.Pad(x, pads=(0, 1, 0, 2), mode="reflect")
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name, z.name]))
>>> vm.set("x", np.arange(10, dtype=np.float32).reshape(2, 5)); vm.forward("s")
>>> vm.get(y.name).tolist(), vm.get(z.name)[0].tolist()
([[4.0, 2.0], [9.0, 7.0]], [1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.graph import BATCH, DType, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    SHAPE_ONLY,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    is_numpy,
    no_flops,
    norm_axis,
    per_input,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm, attrs_as_inputs, inputs_as_attrs

# -- Slice ----------------------------------------------------------------------------------


def slices(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[slice, ...]:
    """ONNX's starts/ends/axes/steps as one Python slice per axis (clamped as ONNX
    clamps: for a negative step the end may be -1, "before the first element")."""
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = list(attrs["axes"]) or list(range(len(starts)))
    steps = list(attrs["steps"]) or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"Slice: starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                         "differ in length")
    out = [slice(None)] * len(shape)
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = norm_axis(int(a), len(shape))
        if a in seen:
            raise ShapeError(f"Slice: axis {a} is given twice")
        seen.add(a)
        d, st = shape[a], int(st)
        if st == 0:
            raise ShapeError("Slice: a step cannot be 0")
        s, e = int(s) + (d if int(s) < 0 else 0), int(e) + (d if int(e) < 0 else 0)
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            out[a] = slice(s, e, st)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            out[a] = slice(s, None if e < 0 else e, st)
    return tuple(out)


def _slice_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    sl = slices(x.shape, attrs)
    if x.batched and sl[0] != slice(None):
        raise ShapeError("Slice: the batch axis (0) cannot be sliced")
    out = tuple(BATCH if (i == 0 and x.batched) else len(range(*s.indices(d)))
                for i, (s, d) in enumerate(zip(sl, x.shape, strict=True)))
    return [TensorDesc(x.dtype, out)]


def _slice(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    view = x[slices(tuple(x.shape), k.attrs)]
    return lambda: xp.copyto(y, view)


def _g_slice(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    return [gb.op("SliceGrad", g[0], n.inputs[0], **n.attrs)]


def _like_second(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [TensorDesc(ins[0].dtype, ins[1].shape)]


def _slice_grad(k: KernelArgs) -> Step:
    xp, dy, dx = k.xp, k.ins[0], k.outs[0]
    view = dx[slices(tuple(dx.shape), k.attrs)]

    def step() -> None:
        dx.fill(0)
        xp.copyto(view, dy)

    return step


SLICE_ATTRS = {"starts": (), "ends": (), "axes": (), "steps": ()}
SLICE_INPUTS = ("starts", "ends", "axes", "steps")  # ONNX inputs 1-4

# -- Pad ------------------------------------------------------------------------------------

MODES = ("constant", "edge", "reflect", "wrap")


def pad_widths(rank: int, attrs: dict[str, Any]) -> list[tuple[int, int]]:
    """(before, after) per axis from ONNX's ``pads`` (all befores, then all afters) over
    ``axes`` (default: every axis)."""
    pads = [int(p) for p in attrs["pads"]]
    axes = [norm_axis(int(a), rank) for a in attrs["axes"]] or list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad: {len(pads)} pads for {len(axes)} axes (two per axis)")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    return widths


def _pad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    if attrs["mode"] not in MODES:
        raise ShapeError(f"Pad: mode {attrs['mode']!r} is not one of {', '.join(MODES)}")
    widths = pad_widths(len(x.shape), attrs)
    if x.batched and widths[0] != (0, 0):
        raise ShapeError("Pad: the batch axis (0) cannot be padded")
    out = []
    for i, (d, (b, a)) in enumerate(zip(x.shape, widths, strict=True)):
        if i == 0 and x.batched:
            out.append(BATCH)
            continue
        n = d + b + a
        if n < 0 or (attrs["mode"] != "constant" and (b > 0 or a > 0) and d == 0):
            raise ShapeError(f"Pad: axis {i} of {x.shape} cannot take pads ({b}, {a})")
        if attrs["mode"] == "reflect" and max(b, a) > d - 1:
            raise ShapeError(f"Pad: reflect needs pads below the axis length, got ({b}, {a}) "
                             f"on axis {i} of length {d}")
        if attrs["mode"] == "wrap" and max(b, a) > d:
            raise ShapeError(f"Pad: wrap needs pads of at most the axis length, got ({b}, {a}) "
                             f"on axis {i} of length {d}")
        out.append(n)
    return [TensorDesc(x.dtype, tuple(out))]


def _inner(shape: tuple[int, ...], widths: list[tuple[int, int]]
           ) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """(the part of x that is kept, where it goes in y): negative pads crop."""
    src, dst = [], []
    for d, (b, a) in zip(shape, widths, strict=True):
        src.append(slice(max(-b, 0), d - max(-a, 0)))
        dst.append(slice(max(b, 0), max(b, 0) + d - max(-b, 0) - max(-a, 0)))
    return tuple(src), tuple(dst)


def _border_copies(y: Any, widths: list[tuple[int, int]], mode: str
                   ) -> list[tuple[Any, Any]]:
    """(target, source) views of y that fill the padding, axis after axis (as numpy's
    np.pad does: a later axis pads the already-padded earlier ones)."""
    out = []
    for ax, (b, a) in enumerate(widths):
        b, a = max(b, 0), max(a, 0)
        if not b and not a:
            continue
        n = y.shape[ax] - b - a  # the length of the data along this axis

        def at(s: slice, ax: int = ax) -> Any:
            return y[(slice(None),) * ax + (s,)]

        if mode == "edge":
            if b:
                out.append((at(slice(0, b)), at(slice(b, b + 1))))
            if a:
                out.append((at(slice(b + n, b + n + a)), at(slice(b + n - 1, b + n))))
        elif mode == "reflect":
            if b:
                out.append((at(slice(0, b)), at(slice(2 * b, b, -1))))
            if a:
                out.append((at(slice(b + n, b + n + a)),
                            at(slice(b + n - 2, b + n - 2 - a if b + n - 2 - a >= 0 else None,
                                     -1))))
        elif mode == "wrap":
            if b:
                out.append((at(slice(0, b)), at(slice(n, n + b))))
            if a:
                out.append((at(slice(b + n, b + n + a)), at(slice(b, b + a))))
    return out


def _pad(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    widths = pad_widths(x.ndim, k.attrs)
    src, dst = _inner(tuple(x.shape), widths)
    xs, ys = x[src], y[dst]
    mode, value = k.attrs["mode"], k.attrs["value"]
    copies = [] if mode == "constant" else _border_copies(y, widths, mode)

    def step() -> None:
        if mode == "constant":
            y.fill(value)
        xp.copyto(ys, xs)
        for target, source in copies:
            xp.copyto(target, source)

    return step


def _g_pad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    return [gb.op("PadGrad", g[0], n.inputs[0], **n.attrs)]


def _pad_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                 ) -> int:
    return 0 if attrs["mode"] == "constant" else ins[0].nbytes()


def _pad_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                    ) -> int:
    """Edge, reflect and wrap padding copied elements: their gradients are added back,
    1 per padded element; constant padding's gradient is a slice."""
    return 0 if attrs["mode"] == "constant" else ins[0].numel() - outs[0].numel()


def _pad_grad(k: KernelArgs) -> Step:
    """Fold each padding back onto what it copied, last axis first (the reverse of the
    forward's order), in a copy of dY; then dX is the inner view."""
    xp, dy, dx = k.xp, k.ins[0], k.outs[0]
    widths = pad_widths(dx.ndim, k.attrs)
    src, dst = _inner(tuple(dx.shape), widths)
    mode = k.attrs["mode"]
    if mode == "constant":
        inner = dy[dst]

        def constant() -> None:
            dx.fill(0)
            xp.copyto(dx[src], inner)

        return constant
    acc = k.scratch(0, dy.shape, dy.dtype)
    folds = []
    for target, source in reversed(_border_copies(acc, widths, mode)):
        # the forward copied source -> target; the gradient adds target onto source,
        # one slice at a time where a source element was copied more than once (edge)
        if mode == "edge" and source.size != target.size:
            ax = next(i for i, (s, t) in enumerate(zip(source.shape, target.shape,
                                                       strict=True)) if s != t)
            for j in range(target.shape[ax]):
                folds.append((source, target[(slice(None),) * ax + (slice(j, j + 1),)]))
        else:
            folds.append((source, target))
    inner = acc[dst]

    def step() -> None:
        xp.copyto(acc, dy)
        for source, target in folds:
            xp.add(source, target, out=source)
        dx.fill(0)
        xp.copyto(dx[src], inner)

    return step


PAD_ATTRS = {"pads": (), "mode": "constant", "value": 0.0, "axes": ()}
PAD_INPUTS = ("pads", "value", "axes")  # ONNX inputs 1-3

# -- Gather ---------------------------------------------------------------------------------


def _gather_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    data, idx = ins
    if idx.dtype not in (DType.INT64, DType.INT32):
        raise ShapeError(f"Gather: indices must be int64 or int32, got {idx.dtype.value}")
    axis = norm_axis(int(attrs["axis"]), len(data.shape))
    if data.batched and axis == 0:
        raise ShapeError("Gather: gathering along the batch axis is not supported")
    shape = (*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])
    if BATCH in shape[1:]:
        raise ShapeError(f"Gather: batched indices {idx.shape} must gather along axis 0 of "
                         f"an unbatched tensor (data {data.shape}, axis {axis})")
    return [TensorDesc(data.dtype, shape)]


def _gather(k: KernelArgs) -> Step:
    xp, (data, idx), y = k.xp, k.ins, k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), data.ndim)
    if is_numpy(xp):
        # mode="wrap" maps ONNX's negative indices (-1 is the last) without a copy of them
        return lambda: xp.take(data, idx, axis=axis, out=y, mode="wrap")
    return lambda: xp.take(data, idx, axis=axis, out=y)  # cupy's take wraps already


def _g_gather(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    return [gb.op("GatherGrad", g[0], n.inputs[1], n.inputs[0], **n.attrs), None]


def _gather_grad(k: KernelArgs) -> Step:
    """dX[..., i, ...] += dY[..., j, ...] for each position j of the indices holding i:
    one add per index position (so repeated indices accumulate)."""
    xp, (dy, idx, _), dx = k.xp, k.ins, k.outs[0]
    axis = norm_axis(int(k.attrs["axis"]), dx.ndim)
    lead = (slice(None),) * axis
    flat_dy = dy.reshape((*dx.shape[:axis], idx.size, *dx.shape[axis + 1:]))
    rows = [flat_dy[(*lead, j)] for j in range(idx.size)]
    flat_idx = idx.reshape(-1)
    d = dx.shape[axis]
    device = _gather_grad_device(xp, dy, flat_idx, dx, axis)
    if device is not None:
        return device

    def step() -> None:
        dx.fill(0)
        for j, row in enumerate(rows):
            target = dx[(*lead, int(flat_idx[j]) % d)]
            xp.add(target, row, out=target)

    return step


# GatherGrad on a GPU: one thread per element of dY adds it into dX at its index (wrapped
# like the forward's), atomically, since indices repeat.  The host's loop reads each
# index back from the device: a wait per index.  The atomic adds of a repeated index
# come in no fixed order, so its sum may differ in the last bit from run to run.
_GATHER_GRAD = ("T dy, raw I idx, int64 N, int64 D, int64 P", "raw T dx",
                "const long long post = i % P, j = (i / P) % N, pre = i / (P * N);"
                "long long at = (long long)idx[j] % D; if (at < 0) at += D;"
                "atomicAdd(&dx[(pre * D + at) * P + post], dy);",
                "calcgraph_gather_grad")


def _gather_grad_device(xp: Any, dy: Any, flat_idx: Any, dx: Any, axis: int) -> Step | None:
    if is_numpy(xp) or dx.dtype not in (np.float32, np.float64) or \
            not (dy.flags.c_contiguous and dx.flags.c_contiguous):
        return None
    kernel = xp.ElementwiseKernel(*_GATHER_GRAD)
    post = math.prod(dx.shape[axis + 1:])
    n, d = int(flat_idx.size), int(dx.shape[axis])

    def step() -> None:
        dx.fill(0)
        kernel(dy, flat_idx, n, d, post, dx)

    return step


# -- Shape ----------------------------------------------------------------------------------


def _shape_range(rank: int, attrs: dict[str, Any]) -> tuple[int, int]:
    start = int(attrs["start"])
    end = rank if attrs["end"] is None else int(attrs["end"])
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return min(max(start, 0), rank), min(max(end, 0), rank)


def _shape_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    s, e = _shape_range(len(ins[0].shape), attrs)
    return [TensorDesc(DType.INT64, (max(e - s, 0),))]


def _shape(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    s, e = _shape_range(x.ndim, k.attrs)
    dims = xp.asarray(x.shape[s:e], dtype=xp.int64)  # the runtime shape: the batch too
    return lambda: xp.copyto(y, dims)


OPS = [
    OpDef(name="Slice", shape=_slice_shape, kernel=_slice, grad=_g_slice, attrs=SLICE_ATTRS,
          flops=no_flops,
          stacking=NOT_STACKED,
          onnx=OnnxForm(name="Slice", export=attrs_as_inputs(*SLICE_INPUTS),
                        import_=inputs_as_attrs(*SLICE_INPUTS), attr_inputs=(1, 2, 3, 4)),
          doc="ONNX Slice with starts/ends/axes/steps as attributes"),
    OpDef(name="SliceGrad", shape=_like_second, kernel=_slice_grad, grad=FIRST_ORDER_ONLY,
          flops=no_flops,
          num_inputs=(2, 2), attrs=SLICE_ATTRS, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX of Slice (dY in the sliced view, zero else)"),
    OpDef(name="Pad", shape=_pad_shape, kernel=_pad, grad=_g_pad, attrs=PAD_ATTRS,
          flops=no_flops,
          stacking=NOT_STACKED,
          onnx=OnnxForm(name="Pad",
                        export=attrs_as_inputs(*PAD_INPUTS, floats=("value",), keep=("mode",)),
                        import_=inputs_as_attrs(*PAD_INPUTS), attr_inputs=(1, 2, 3)),
          doc="ONNX Pad (constant, edge, reflect, wrap) with pads/value/axes as attributes"),
    OpDef(name="PadGrad", shape=_like_second, kernel=_pad_grad, grad=FIRST_ORDER_ONLY,
          flops=_pad_grad_flops,
          workspace=_pad_grad_ws, num_inputs=(2, 2), attrs=PAD_ATTRS, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL,
          doc="internal: dX of Pad (the padding folded back onto its sources)"),
    OpDef(name="Gather", shape=_gather_shape, kernel=_gather, grad=_g_gather, num_inputs=(2, 2),
          flops=no_flops,
          attrs={"axis": 0}, stacking=NOT_STACKED, onnx=OnnxForm(name="Gather"),
          doc="ONNX Gather: data[..., indices, ...] along `axis`"),
    OpDef(name="GatherGrad", shape=lambda ins, attrs: [ins[2]], kernel=_gather_grad,
          flops=per_input(1),
          grad=FIRST_ORDER_ONLY, num_inputs=(3, 3), attrs={"axis": 0},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX of Gather (dY added at the gathered indices)"),
    OpDef(name="Shape", shape=_shape_shape, kernel=_shape, grad=SHAPE_ONLY,
          flops=no_flops,
          attrs={"start": 0, "end": None}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="Shape", needs_shapes=True),
          doc="ONNX Shape: the dimensions start:end of the input (the runtime batch too)"),
]
