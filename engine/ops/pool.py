"""2-D pooling: ``MaxPool``, ``AveragePool`` (ONNX, ``ceil_mode`` 0) and
``GlobalAveragePool``, with their gradients.

Windows are read through a strided view of the (padded) input, copied once into the
workspace as ``[N, C, oH, oW, kH·kW]``, and reduced along the last axis.  The
gradients scatter back with one strided add per kernel position (max pooling: only
where that position held the window's maximum, found again from the input, so nothing
but the output is kept between forward and backward).
"""

from __future__ import annotations

from typing import Any

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


def _sizes(x: tuple[int, ...], geo: dict[str, Any], item: int) -> tuple[int, int]:
    n, c = x[0], x[1]
    padded = n * c * geo["padded"][0] * geo["padded"][1] if any(geo["pads"]) else 0
    cols = n * c * geo["out"][0] * geo["out"][1] * geo["k"][0] * geo["k"][1]
    return align(padded * item), align(cols * item)


def _pool_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    x = ins[0].shape
    geo = pool_geometry(x, attrs)
    a, b = _sizes(x, geo, ins[0].dtype.itemsize)
    n_out = x[0] * x[1] * geo["out"][0] * geo["out"][1]
    return a + b + align(n_out * 8) + align(n_out)  # + argmax (int64), mask (bool)


def _windows(xp: Any, x: Any, ws: Any, geo: dict[str, Any], fill: float
             ) -> tuple[Step, Any, Any, int]:
    """A step copying the windows of ``x`` into ``[N, C, oH, oW, k]``; that view; the
    padded buffer (or ``x``); the workspace offset after them."""
    n, c = x.shape[0], x.shape[1]
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    oh, ow = geo["out"]
    item = x.dtype.itemsize
    pad, buf, at = padded_copy(xp, x, ws, geo, 0, fill)
    steps = [pad] if pad is not None else []
    cols = ws[at: at + n * c * oh * ow * kh * kw * item].view(x.dtype) \
        .reshape(n, c, oh, ow, kh, kw)
    at += align(n * c * oh * ow * kh * kw * item)
    s0, s1, s2, s3 = buf.strides
    view = xp.lib.stride_tricks.as_strided(buf, shape=(n, c, oh, ow, kh, kw),
                                           strides=(s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw))
    steps.append(lambda: xp.copyto(cols, view))

    def run() -> None:
        for f in steps:
            f()

    return run, cols.reshape(n, c, oh, ow, kh * kw), buf, at


def _max_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    fill, cols, _, _ = _windows(xp, x, k.ws, geo, float("-inf"))

    def step() -> None:
        fill()
        xp.max(cols, axis=-1, out=y)

    return step


def _counts(xp: Any, geo: dict[str, Any], shape: tuple[int, ...], include_pad: bool) -> Any:
    """How many input cells each output window covers (a constant of the geometry)."""
    import numpy as np

    (oh, ow), (kh, kw), (sh, sw), (dh, dw) = geo["out"], geo["k"], geo["s"], geo["d"]
    pads = geo["pads"]
    if include_pad:
        return float(kh * kw)
    rows = np.array([sum(0 <= r * sh + i * dh - pads[0] < shape[2] for i in range(kh))
                     for r in range(oh)])
    cols = np.array([sum(0 <= q * sw + j * dw - pads[1] < shape[3] for j in range(kw))
                     for q in range(ow)])
    return rows[:, None] * cols[None, :]


def _avg_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    fill, cols, _, at = _windows(xp, x, k.ws, geo, 0.0)
    counts = _counts(xp, geo, tuple(x.shape), bool(k.attrs.get("count_include_pad", 0)))
    if isinstance(counts, float):
        inv = 1.0 / counts

        def uniform() -> None:
            fill()
            xp.sum(cols, axis=-1, out=y)
            xp.multiply(y, inv, out=y)

        return uniform
    # 1 / count per output cell, kept in the workspace (rewritten each step: the
    # workspace is shared) -- a [oH, oW] table, small.
    table = k.scratch(at, counts.shape, x.dtype)
    host = (1.0 / counts).astype(table.dtype)

    def varying() -> None:
        fill()
        xp.sum(cols, axis=-1, out=y)
        table[...] = host if xp.__name__ == "numpy" else xp.asarray(host)
        xp.multiply(y, table, out=y)

    return varying


def _g_pool(grad_op: str) -> Any:
    def rule(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
        return [gb.op(grad_op, n.inputs[0], g[0], **n.attrs)] if g[0] else [None]

    return rule


def _pool_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, dy = ins[0], ins[1]
    if _pool_shape([x], attrs)[0].shape != dy.shape:
        raise ShapeError(f"pooling gradient: dY {dy.shape} is not the output of {x.shape}")
    return [x]


def _pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                  ) -> int:
    x = ins[0].shape
    geo = pool_geometry(x, attrs)
    n, c = x[0], x[1]
    padded = align(n * c * geo["padded"][0] * geo["padded"][1] * ins[0].dtype.itemsize)
    return _pool_ws(ins, outs, attrs, device) + padded  # + the padded dX


def _scatter(xp: Any, geo: dict[str, Any], dxp: Any) -> list[Any]:
    """The strided window of ``dxp`` each kernel position adds into."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = geo["k"], geo["s"], geo["d"], geo["out"]
    return [dxp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            for i in range(kh) for j in range(kw)]


def _max_pool_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    fill, cols, _, at = _windows(xp, x, k.ws, geo, float("-inf"))
    n, c, (oh, ow), (hp, wp), pads = x.shape[0], x.shape[1], geo["out"], geo["padded"], \
        geo["pads"]
    arg = k.scratch(at, (n, c, oh, ow), "int64")
    at += align(n * c * oh * ow * 8)
    mask = k.scratch(at, (n, c, oh, ow), "bool")
    at += align(n * c * oh * ow)
    dxp = k.scratch(at, (n, c, hp, wp), dx.dtype)
    targets = _scatter(xp, geo, dxp)
    inner = dxp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]

    def step() -> None:
        fill()
        xp.argmax(cols, axis=-1, out=arg)  # the first maximum, as the forward took
        dxp.fill(0)
        for pos, target in enumerate(targets):
            xp.equal(arg, pos, out=mask)
            xp.add(target, dy, out=target, where=mask)
        xp.copyto(dx, inner)

    return step


def _avg_pool_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    n, c, (oh, ow), (hp, wp), pads = x.shape[0], x.shape[1], geo["out"], geo["padded"], \
        geo["pads"]
    a, b = _sizes(tuple(x.shape), geo, x.dtype.itemsize)
    at = a + b + align(n * c * oh * ow * 8) + align(n * c * oh * ow)
    share = k.scratch(at, (n, c, oh, ow), dx.dtype)  # dY / count
    at += align(n * c * oh * ow * dx.dtype.itemsize)
    dxp = k.scratch(at, (n, c, hp, wp), dx.dtype)
    counts = _counts(xp, geo, tuple(x.shape), bool(k.attrs.get("count_include_pad", 0)))
    host = (1.0 / counts) if isinstance(counts, float) else (1.0 / counts).astype(dx.dtype)
    targets = _scatter(xp, geo, dxp)
    inner = dxp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]
    table = None if isinstance(host, float) else \
        k.scratch(a, host.shape, dx.dtype)  # the (unused here) padded-input slot

    def step() -> None:
        if table is None:
            xp.multiply(dy, host, out=share)
        else:
            table[...] = host if xp.__name__ == "numpy" else xp.asarray(host)
            xp.multiply(dy, table, out=share)
        dxp.fill(0)
        for target in targets:
            xp.add(target, share, out=target)
        xp.copyto(dx, inner)

    return step


def _avg_pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    x = ins[0].shape
    geo = pool_geometry(x, attrs)
    n, c = x[0], x[1]
    item = ins[0].dtype.itemsize
    return (_pool_grad_ws(ins, outs, attrs, device)
            + align(n * c * geo["out"][0] * geo["out"][1] * item)
            + align(geo["out"][0] * geo["out"][1] * item))


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
    OpDef("MaxPool", _pool_shape, _max_pool, _g_pool("MaxPoolGrad"), (), _pool_ws,
          attrs=dict(POOL_ATTRS), doc="ONNX MaxPool, 2-D (ceil_mode 0; no Indices output)"),
    OpDef("AveragePool", _pool_shape, _avg_pool, _g_pool("AveragePoolGrad"), (), _pool_ws,
          attrs=dict(POOL_ATTRS), doc="ONNX AveragePool, 2-D (ceil_mode 0)"),
    OpDef("GlobalAveragePool", _gap_shape, _gap, _g_gap,
          doc="ONNX GlobalAveragePool: the mean over every spatial axis"),
    OpDef("MaxPoolGrad", _pool_grad_shape, _max_pool_grad, FIRST_ORDER_ONLY, (),
          _pool_grad_ws, num_inputs=(2, 2), attrs=dict(POOL_ATTRS),
          doc="internal: dY to each window's (first) maximum"),
    OpDef("AveragePoolGrad", _pool_grad_shape, _avg_pool_grad, FIRST_ORDER_ONLY, (),
          _avg_pool_grad_ws, num_inputs=(2, 2), attrs=dict(POOL_ATTRS),
          doc="internal: dY / count spread over each window"),
]
