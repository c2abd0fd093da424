"""2-D pooling: ``MaxPool``, ``AveragePool`` (ONNX, ``ceil_mode`` 0) and
``GlobalAveragePool``, with their gradients.

A window position ``(i, j)`` of the kernel is one strided view of the (padded) input,
of the output's shape, so pooling is ``kH·kW`` elementwise calls — ``maximum`` or
``add`` into the output — with no copy of the windows (copying them and reducing the
last, tiny axis took five times as long).  The gradients scatter back through the same
views of a padded ``dX``: max pooling only where that position held the window's first
maximum (compared with the output, so nothing more is kept from the forward).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    align,
    masked_add,
    need_float,
)
from engine.ops.conv import conv_geometry, padded_copy

POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": (), "kernel_shape": (),
              "pads": (), "strides": (), "storage_order": 0, "count_include_pad": 0}


def pool_geometry(x: tuple[int, ...], attrs: dict[str, Any]) -> dict[str, Any]:
    if int(attrs.get("ceil_mode", 0)):
        raise ShapeError("pooling with ceil_mode=1 is not supported")
    if int(attrs.get("storage_order", 0)):
        raise ShapeError("pooling with storage_order=1 is not supported")
    k = tuple(attrs.get("kernel_shape") or ())
    if len(k) != 2:
        raise ShapeError(f"2-D pooling needs kernel_shape of two values, got {k}")
    if len(x) != 4:
        raise ShapeError(f"2-D pooling needs [N, C, H, W], got {x}")
    # The window arithmetic is a convolution's with one channel per group.
    return conv_geometry(x, (x[1], 1, *k), {**attrs, "group": x[1]})


def _pool_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    x = ins[0].shape
    geo = pool_geometry(x, attrs)
    return [TensorDesc(ins[0].dtype, (x[0], x[1], *geo["out"]))]


def _padded_bytes(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    """The padded copy of an ``[N, C, H, W]`` tensor (none without padding)."""
    if not any(geo["pads"]):
        return 0
    return align(x[0] * x[1] * geo["padded"][0] * geo["padded"][1] * item)


def _out_bytes(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    return align(x[0] * x[1] * geo["out"][0] * geo["out"][1] * item)


def _pool_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    return _padded_bytes(x, geo, item) + align(geo["out"][0] * geo["out"][1] * item)


def _views(buf: Any, geo: dict[str, Any]) -> list[Any]:
    """For each kernel position, the strided view of ``buf`` it reads (or writes)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = geo["k"], geo["s"], geo["d"], geo["out"]
    return [buf[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            for i in range(kh) for j in range(kw)]


def _max_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    pad, buf, _ = padded_copy(xp, x, k.ws, geo, 0, float("-inf"))
    return _fold(xp.maximum, xp, y, pad, _views(buf, geo))


def _fold(ufunc: Any, xp: Any, y: Any, pad: Step | None, views: list[Any]) -> Step:
    """``y = ufunc(...ufunc(v0, v1)..., vk)`` over the kernel positions' views."""
    first, *rest = views

    def step() -> None:
        if pad is not None:
            pad()
        xp.copyto(y, first)
        for v in rest:
            ufunc(y, v, out=y)

    return step


def _inverse_counts(geo: dict[str, Any], shape: tuple[int, ...], include_pad: bool
                    ) -> float | np.ndarray:
    """1 / the number of input cells each output window averages (a constant)."""
    (oh, ow), (kh, kw), (sh, sw), (dh, dw) = geo["out"], geo["k"], geo["s"], geo["d"]
    pads = geo["pads"]
    if include_pad or not any(pads):
        return 1.0 / (kh * kw)
    rows = np.array([sum(0 <= r * sh + i * dh - pads[0] < shape[2] for i in range(kh))
                     for r in range(oh)])
    cols = np.array([sum(0 <= q * sw + j * dw - pads[1] < shape[3] for j in range(kw))
                     for q in range(ow)])
    return 1.0 / (rows[:, None] * cols[None, :])


def _scale_step(xp: Any, k: KernelArgs, inv: float | np.ndarray, at: int, target: Any
                ) -> Step:
    """``target *= inv`` (a scalar, or an [oH, oW] table kept in the workspace: it is
    written each step, as the workspace is shared)."""
    if isinstance(inv, float):
        return lambda: xp.multiply(target, inv, out=target)
    table = k.scratch(at, inv.shape, target.dtype)
    host = inv.astype(table.dtype)
    on_host = xp.__name__ == "numpy"

    def scale() -> None:
        table[...] = host if on_host else xp.asarray(host)
        xp.multiply(target, table, out=target)

    return scale


def _avg_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    pad, buf, at = padded_copy(xp, x, k.ws, geo, 0, 0.0)
    total = _fold(xp.add, xp, y, pad, _views(buf, geo))
    scale = _scale_step(xp, k, _inverse_counts(geo, tuple(x.shape),
                                               bool(k.attrs.get("count_include_pad", 0))),
                        at, y)

    def step() -> None:
        total()
        scale()

    return step


def _pool_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, dy = ins[0], ins[-1]
    if _pool_shape([x], attrs)[0].shape != dy.shape:
        raise ShapeError(f"pooling gradient: dY {dy.shape} is not the output of {x.shape}")
    return [x]


def _dx_parts(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    """A padded dX is always needed (views of it are written)."""
    return align(x[0] * x[1] * geo["padded"][0] * geo["padded"][1] * item)


def _max_pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    return (_padded_bytes(x, geo, item) + _dx_parts(x, geo, item)
            + 2 * _out_bytes(x, geo, 1) + _out_bytes(x, geo, item))


def _max_pool_grad(k: KernelArgs) -> Step:
    xp, (x, y, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    n, c, pads, (hp, wp) = x.shape[0], x.shape[1], geo["pads"], geo["padded"]
    pad, buf, at = padded_copy(xp, x, k.ws, geo, 0, float("-inf"))
    dxp = k.scratch(at, (n, c, hp, wp), dx.dtype)
    at += _dx_parts(tuple(x.shape), geo, dx.dtype.itemsize)
    mask = k.scratch(at, y.shape, "bool")
    at += _out_bytes(tuple(x.shape), geo, 1)
    free = k.scratch(at, y.shape, "bool")
    at += _out_bytes(tuple(x.shape), geo, 1)
    add_where = masked_add(xp, k.scratch(at, y.shape, dy.dtype))
    pairs = list(zip(_views(buf, geo), _views(dxp, geo), strict=True))
    inner = dxp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]

    def step() -> None:
        if pad is not None:
            pad()
        dxp.fill(0)
        free.fill(True)  # windows whose maximum is not yet found
        for window, target in pairs:
            xp.equal(window, y, out=mask)
            xp.logical_and(mask, free, out=mask)
            add_where(target, dy, mask)
            xp.logical_xor(free, mask, out=free)
        xp.copyto(dx, inner)

    return step


def _avg_pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    return (_dx_parts(x, geo, item) + _out_bytes(x, geo, item)
            + align(geo["out"][0] * geo["out"][1] * item))


def _avg_pool_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    n, c, pads, (hp, wp) = x.shape[0], x.shape[1], geo["pads"], geo["padded"]
    dxp = k.scratch(0, (n, c, hp, wp), dx.dtype)
    at = _dx_parts(tuple(x.shape), geo, dx.dtype.itemsize)
    share = k.scratch(at, dy.shape, dx.dtype)  # dY / count
    at += _out_bytes(tuple(x.shape), geo, dx.dtype.itemsize)
    scale = _scale_step(xp, k, _inverse_counts(geo, tuple(x.shape),
                                               bool(k.attrs.get("count_include_pad", 0))),
                        at, share)
    targets = _views(dxp, geo)
    inner = dxp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]

    def step() -> None:
        xp.copyto(share, dy)
        scale()
        dxp.fill(0)
        for target in targets:
            xp.add(target, share, out=target)
        xp.copyto(dx, inner)

    return step


def _g_max_pool(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("MaxPoolGrad", n.inputs[0], n.outputs[0], g[0], **n.attrs)] if g[0] \
        else [None]


def _g_avg_pool(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("AveragePoolGrad", n.inputs[0], g[0], **n.attrs)] if g[0] else [None]


def _gap_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    x = ins[0].shape
    if len(x) < 3:
        raise ShapeError(f"GlobalAveragePool needs [N, C, spatial...], got {x}")
    return [TensorDesc(ins[0].dtype, (*x[:2], *([1] * (len(x) - 2))))]


def _gap(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axes = tuple(range(2, x.ndim))
    return lambda: xp.mean(x, axis=axes, keepdims=True, out=y)


def _g_gap(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    rank = len(gb.desc(n.inputs[0]).shape)
    return [gb.op("ReduceGrad", g[0], n.inputs[0], axes=tuple(range(2, rank)), keepdims=1,
                  mean=1)]


OPS = [
    OpDef("MaxPool", _pool_shape, _max_pool, _g_max_pool, (), _pool_ws,
          attrs=dict(POOL_ATTRS), doc="ONNX MaxPool, 2-D (ceil_mode 0; no Indices output)"),
    OpDef("AveragePool", _pool_shape, _avg_pool, _g_avg_pool, (), _pool_ws,
          attrs=dict(POOL_ATTRS), doc="ONNX AveragePool, 2-D (ceil_mode 0)"),
    OpDef("GlobalAveragePool", _gap_shape, _gap, _g_gap,
          doc="ONNX GlobalAveragePool: the mean over every spatial axis"),
    OpDef("MaxPoolGrad", _pool_grad_shape, _max_pool_grad, FIRST_ORDER_ONLY, (),
          _max_pool_grad_ws, num_inputs=(3, 3), attrs=dict(POOL_ATTRS),
          doc="internal: dY to each window's first maximum (found by comparing with Y)"),
    OpDef("AveragePoolGrad", _pool_grad_shape, _avg_pool_grad, FIRST_ORDER_ONLY, (),
          _avg_pool_grad_ws, num_inputs=(2, 2), attrs=dict(POOL_ATTRS),
          doc="internal: dY / count spread over each window"),
]
