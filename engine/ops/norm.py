"""Normalisation: ``BatchNormalization``, ``LayerNormalization`` and ``LRN`` (ONNX), with
gradients.

Batch normalisation in training mode (``training_mode=1``) normalises with the batch's
statistics over every axis but the channels.  ONNX returns the updated running
statistics as outputs 1 and 2; a model trained by this engine keeps them as
non-trainable parameters instead (``running_update=1``): the op writes the new values
into its ``input_mean`` and ``input_var`` in place, so they live in the forward zone
with the other parameters, are saved and restored by model switching, and are what
the inference path (``training_mode=0``) reads.  ``unbiased=1`` (an engine attribute,
for PyTorch's ``BatchNorm``) updates the running variance with the batch's unbiased
variance, ``var * n / (n - 1)`` over the ``n`` values per channel; normalisation itself
always uses the biased one, as ONNX and PyTorch do.

The kernels reduce the variance from the output buffer used as scratch, and batch
normalisation's gradient reuses ``dX`` the same way, so their workspace holds a few
per-channel (or per-row) vectors only; layer normalisation's gradient also keeps the
normalised input (the input's size).  Gradients recompute the mean and variance from
``X`` instead of keeping them from the forward.

>>> import numpy as np
>>> from engine import CalcGraph, Init, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 2))
>>> s, b = (g.parameter(n, (2,), init=Init.ones() if n == "s" else Init.zeros()) for n in "sb")
>>> m = g.parameter("m", (2,), init=Init.zeros(), trainable=False)
>>> v = g.parameter("v", (2,), init=Init.ones(), trainable=False)
>>> y = g.path("norm", Mode.FORWARD_ONLY).BatchNormalization(
...     x, s, b, m, v, training_mode=1, running_update=1, epsilon=0.0)
>>> vm = VM(compile_graph(g, batch_size=2, keep=[y.name]))
>>> vm.set("x", np.array([[1.0, 10.0], [3.0, 30.0]], np.float32)); vm.forward("norm")
>>> vm.get(y.name).tolist(), vm.get("m").tolist()
([[-1.0, -1.0], [1.0, 1.0]], [0.20000000298023224, 2.0])
"""

from __future__ import annotations

import math
from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import Node, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    need_float,
    per_output,
)
from engine.ops._onnx import ENGINE_INTERNAL, Exported, ImportContext, OnnxForm

# FLOPs per element of X, the kernels' passes (the per-channel or per-row work is not
# counted): the batch's moments are a sum, a subtraction, a square and a sum (4).
BN_FLOPS = {True: 6, False: 2}
"""BatchNormalization by ``training_mode``: the moments and ``x·a + b``, or ``x·a + b``."""
BN_GRAD_FLOPS = {True: 11, False: 5}
"""Its gradient: dB's and dScale's sums and products (4), and dX through the batch's
statistics (7) or ``dY·a`` with running ones (1)."""
LN_FLOPS = 7
"""LayerNormalization: the moments, ``(x - mean)·istd·scale`` (and 1 more for a bias)."""
LN_GRAD_FLOPS = 18
"""Its gradient: the moments and x-hat (6), dB's and dScale's sums (3), the two
row products with Scale (4) and dX (5)."""


def moments(xp: Any, x: Any, axes: Any, mean: Any, istd: Any, scratch: Any, inv_n: float,
            eps: float) -> None:
    """``mean`` and ``1 / sqrt(var + eps)`` of ``x`` over ``axes`` (kept dims), with
    ``scratch`` (x's shape) for the squared deviations."""
    xp.sum(x, axis=axes, keepdims=True, out=mean)
    xp.multiply(mean, inv_n, out=mean)
    xp.subtract(x, mean, out=scratch)
    xp.multiply(scratch, scratch, out=scratch)
    xp.sum(scratch, axis=axes, keepdims=True, out=istd)
    xp.multiply(istd, inv_n, out=istd)
    xp.add(istd, eps, out=istd)
    xp.sqrt(istd, out=istd)
    xp.divide(1.0, istd, out=istd)


# -- BatchNormalization -----------------------------------------------------------------


def _channels(x: TensorDesc) -> int:
    if len(x.shape) < 2:
        raise ShapeError(f"BatchNormalization needs [N, C, ...], got {x.shape}")
    return x.shape[1]


def _bn_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    need_float(x, "BatchNormalization X")
    c = _channels(x)
    for d, what in zip(ins[1:], ("scale", "B", "input_mean", "input_var"), strict=True):
        if d.shape != (c,):
            raise ShapeError(f"BatchNormalization: {what} has shape {d.shape}; X {x.shape} "
                             f"has {c} channels, so it must be ({c},)")
        if d.dtype != x.dtype:
            raise ShapeError(f"BatchNormalization: {what} is {d.dtype.value}, X "
                             f"{x.dtype.value}")
    stat = TensorDesc(x.dtype, (c,))
    return [x, stat, stat]


def _views(k: KernelArgs) -> tuple[Any, tuple[int, ...], tuple[int, ...], float]:
    """The input, the reduction axes, the per-channel broadcast shape and 1/count."""
    x = k.ins[0]
    axes = (0, *range(2, x.ndim))
    cshape = (1, x.shape[1], *(1,) * (x.ndim - 2))
    count = x.size // max(x.shape[1], 1)
    return x, axes, cshape, 1.0 / max(count, 1)


def _bn_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return 4 * align_up(_channels(ins[0]) * ins[0].dtype.itemsize)


def _vectors(k: KernelArgs, n: int, cshape: tuple[int, ...], dtype: Any) -> list[Any]:
    size = align_up(cshape[1] * k.xp.dtype(dtype).itemsize)
    return [k.scratch(i * size, cshape, dtype) for i in range(n)]


def _bn(k: KernelArgs) -> Step:
    xp = k.xp
    x, axes, cshape, inv_n = _views(k)
    y = k.outs[0]
    scale, bias, r_mean, r_var = (a.reshape(cshape) for a in k.ins[1:])
    eps, momentum = float(k.attrs["epsilon"]), float(k.attrs["momentum"])
    mean, var, a, b = _vectors(k, 4, cshape, x.dtype)
    extra = [o.reshape(cshape) for o in k.outs[1:]]
    training = int(k.attrs["training_mode"])
    update = int(k.attrs["running_update"])
    count = x.size // max(x.shape[1], 1)  # values per channel at the bound batch
    # PyTorch's running variance is the batch's unbiased estimate: n / (n - 1) times it
    correction = count / (count - 1) if int(k.attrs["unbiased"]) and count > 1 else 1.0

    def coefficients(m: Any, v: Any) -> None:
        """y = x * a + b with a = scale / sqrt(v + eps), b = bias - m * a."""
        xp.add(v, eps, out=a)
        xp.sqrt(a, out=a)
        xp.divide(scale, a, out=a)
        xp.multiply(m, a, out=b)
        xp.subtract(bias, b, out=b)

    def step() -> None:
        if training:
            xp.sum(x, axis=axes, keepdims=True, out=mean)
            xp.multiply(mean, inv_n, out=mean)
            xp.subtract(x, mean, out=y)  # y as scratch for the squared deviations
            xp.multiply(y, y, out=y)
            xp.sum(y, axis=axes, keepdims=True, out=var)
            xp.multiply(var, inv_n, out=var)
            coefficients(mean, var)
        else:
            coefficients(r_mean, r_var)
        xp.multiply(x, a, out=y)
        xp.add(y, b, out=y)
        if training:
            _update(xp, extra, update, r_mean, r_var, mean, var, momentum, a, correction)

    return step


def _update(xp: Any, extra: list[Any], update: int, r_mean: Any, r_var: Any, mean: Any,
            var: Any, momentum: float, tmp: Any, correction: float = 1.0) -> None:
    """The new running statistics, ``momentum * running + (1 - momentum) * batch``: into
    the outputs ONNX names, and with ``running_update`` into the running inputs.  The
    batch's variance is multiplied by ``correction`` (``n / (n - 1)`` with ``unbiased``)."""
    for i, (run, batch) in enumerate(((r_mean, mean), (r_var, var))):
        targets = ([extra[i]] if i < len(extra) else []) + ([run] if update else [])
        if not targets:
            continue
        xp.multiply(batch, (1.0 - momentum) * (correction if i else 1.0), out=tmp)
        first = targets[0]
        xp.multiply(run, momentum, out=first)
        xp.add(first, tmp, out=first)
        for t in targets[1:]:
            xp.copyto(t, first)


def _bn_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    return BN_FLOPS[bool(int(attrs["training_mode"]))] * ins[0].numel()


def _bn_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    return BN_GRAD_FLOPS[bool(int(attrs["training_mode"]))] * ins[1].numel()


def _g_bn(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if g[0] is None:
        return [None] * 5
    x, scale, _, mean, var = n.inputs
    attrs = {"epsilon": n.attrs["epsilon"], "training_mode": n.attrs["training_mode"]}
    dx = gb.op("BatchNormalizationGrad", g[0], x, scale, mean, var, **attrs)
    return [dx, f"{dx}:1", f"{dx}:2", None, None]  # the grad op's outputs 1 and 2


def _bn_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dy, x = ins[0], ins[1]
    if dy.shape != x.shape:
        raise ShapeError(f"BatchNormalizationGrad: dY {dy.shape} and X {x.shape} differ")
    c = TensorDesc(x.dtype, (_channels(x),))
    return [x, c, c]


def _bn_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                ) -> int:
    return 3 * align_up(_channels(ins[1]) * ins[1].dtype.itemsize)


def _bn_grad(k: KernelArgs) -> Step:
    xp = k.xp
    dy = k.ins[0]
    x = k.ins[1]
    axes = (0, *range(2, x.ndim))
    cshape = (1, x.shape[1], *(1,) * (x.ndim - 2))
    inv_n = 1.0 / max(x.size // max(x.shape[1], 1), 1)
    scale, r_mean, r_var = (a.reshape(cshape) for a in k.ins[2:])
    dx, dscale, dbias = k.outs[0], k.outs[1].reshape(cshape), k.outs[2].reshape(cshape)
    eps = float(k.attrs["epsilon"])
    mean, istd, coef = _vectors(k, 3, cshape, x.dtype)
    training = int(k.attrs["training_mode"])

    def step() -> None:
        if training:  # the batch's statistics, as the forward used them
            moments(xp, x, axes, mean, istd, dx, inv_n, eps)
        else:
            xp.copyto(mean, r_mean)
            xp.add(r_var, eps, out=istd)
            xp.sqrt(istd, out=istd)
            xp.divide(1.0, istd, out=istd)
        xp.sum(dy, axis=axes, keepdims=True, out=dbias)
        xp.subtract(x, mean, out=dx)  # x - mean; times istd is x-hat
        xp.multiply(dx, dy, out=dx)
        xp.sum(dx, axis=axes, keepdims=True, out=dscale)
        xp.multiply(dscale, istd, out=dscale)  # sum(dY * x-hat)
        xp.multiply(scale, istd, out=coef)  # a = scale / std
        if not training:  # statistics are constants: dX = a * dY
            xp.multiply(dy, coef, out=dx)
            return
        # dX = a * (dY - mean(dY) - x-hat * mean(dY * x-hat))
        xp.subtract(x, mean, out=dx)
        xp.multiply(dx, istd, out=dx)
        xp.multiply(dx, dscale, out=dx)
        xp.multiply(dx, inv_n, out=dx)
        xp.subtract(dy, dx, out=dx)
        xp.multiply(dbias, inv_n, out=mean)  # mean is free now
        xp.subtract(dx, mean, out=dx)
        xp.multiply(dx, coef, out=dx)

    return step


# -- LayerNormalization -----------------------------------------------------------------


def _axis(rank: int, attrs: dict[str, Any]) -> int:
    axis = int(attrs["axis"])
    if not -rank <= axis < rank:
        raise ShapeError(f"LayerNormalization: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _ln_axis(x: TensorDesc, attrs: dict[str, Any]) -> int:
    return _axis(len(x.shape), attrs)


def _ln_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    need_float(x, "LayerNormalization X")
    axis = _ln_axis(x, attrs)
    norm = x.shape[axis:]
    for d, what in zip(ins[1:], ("Scale", "B"), strict=False):
        if len(d.shape) > len(norm) or any(
                a not in (1, b) for a, b in zip(d.shape[::-1], norm[::-1], strict=False)):
            raise ShapeError(f"LayerNormalization: {what} {d.shape} does not broadcast to the "
                             f"normalised shape {norm}")
    stat = TensorDesc(x.dtype, (*x.shape[:axis], *(1,) * (len(x.shape) - axis)))
    return [x, stat, stat]


def _rows(x: Any, axis: int) -> tuple[int, int]:
    d = 1
    for v in x.shape[axis:]:
        d *= int(v)
    return x.size // max(d, 1), d


def _ln_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    x = ins[0]
    axis = _ln_axis(x, attrs)
    r = 1
    for v in x.shape[:axis]:
        r *= v
    return 2 * align_up(r * x.dtype.itemsize)


def _ln(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    axis = _axis(x.ndim, k.attrs)
    r, d = _rows(x, axis)
    x2, y2 = x.reshape(r, d), y.reshape(r, d)
    norm = tuple(x.shape[axis:])
    scale = xp.broadcast_to(k.ins[1], norm).reshape(1, d) if k.ins[1].shape == norm else None
    scale_b = k.ins[1]
    bias = k.ins[2] if len(k.ins) > 2 else None
    y_norm = y.reshape((*x.shape[:axis], *norm))
    eps = float(k.attrs["epsilon"])
    mean, istd = (k.scratch(i * align_up(r * x.dtype.itemsize), (r, 1), x.dtype) for i in range(2))
    outs = [o.reshape(r, 1) for o in k.outs[1:]]

    def step() -> None:
        moments(xp, x2, 1, mean, istd, y2, 1.0 / d, eps)
        xp.subtract(x2, mean, out=y2)
        xp.multiply(y2, istd, out=y2)
        if scale is not None:
            xp.multiply(y2, scale, out=y2)
        else:
            xp.multiply(y_norm, scale_b, out=y_norm)
        if bias is not None:
            xp.add(y_norm, bias, out=y_norm)
        for o, v in zip(outs, (mean, istd), strict=False):
            xp.copyto(o, v)

    return step


def _ln_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    return (LN_FLOPS + (len(ins) > 2)) * ins[0].numel()


def _g_ln(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if g[0] is None:
        return [None] * len(n.inputs)
    x, scale = n.inputs[0], n.inputs[1]
    axis = _ln_axis(gb.desc(x), n.attrs)
    if gb.desc(scale).shape != gb.desc(x).shape[axis:]:
        raise ShapeError(f"LayerNormalization: training needs Scale at the normalised shape "
                         f"{gb.desc(x).shape[axis:]}, not {gb.desc(scale).shape}")
    dx = gb.op("LayerNormalizationGrad", g[0], x, scale, axis=n.attrs["axis"],
               epsilon=n.attrs["epsilon"])
    dscale, dbias = f"{dx}:1", f"{dx}:2"  # the grad op's outputs 1 and 2
    ds = _reduce_to(gb, dscale, gb.desc(scale).shape)
    grads: list[str | None] = [dx, ds]
    if len(n.inputs) > 2:
        grads.append(_reduce_to(gb, dbias, gb.desc(n.inputs[2]).shape))
    return grads


def _reduce_to(gb: GradBuilder, g: str, shape: tuple[int, ...]) -> str:
    """``g`` (of the normalised shape) summed down to a broadcast parameter's shape."""
    have = gb.desc(g).shape
    if have == shape:
        return g
    from engine.ops.elementwise import sum_to_axes

    return gb.op("SumTo", g, axes=sum_to_axes(have, shape), shape=shape)


def _ln_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dy, x = ins[0], ins[1]
    if dy.shape != x.shape:
        raise ShapeError(f"LayerNormalizationGrad: dY {dy.shape} and X {x.shape} differ")
    axis = _ln_axis(x, attrs)
    norm = TensorDesc(x.dtype, x.shape[axis:])
    return [x, norm, norm]


def _ln_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                ) -> int:
    x = ins[1]
    axis = _ln_axis(x, attrs)
    r = 1
    for v in x.shape[:axis]:
        r *= v
    return 4 * align_up(r * x.dtype.itemsize) + align_up(x.numel() * x.dtype.itemsize)


def _ln_grad(k: KernelArgs) -> Step:
    xp = k.xp
    dy, x = k.ins[0], k.ins[1]
    axis = _axis(x.ndim, k.attrs)
    r, d = _rows(x, axis)
    dy2, x2, dx2 = dy.reshape(r, d), x.reshape(r, d), k.outs[0].reshape(r, d)
    scale = k.ins[2].reshape(d)  # full-size (the gradient rule makes sure)
    dscale, dbias = k.outs[1].reshape(d), k.outs[2].reshape(d)
    eps = float(k.attrs["epsilon"])
    size = align_up(r * x.dtype.itemsize)
    mean, istd, s1, s2 = (k.scratch(i * size, (r, 1), x.dtype) for i in range(4))
    xhat = k.scratch(4 * size, (r, d), x.dtype)

    def step() -> None:
        moments(xp, x2, 1, mean, istd, dx2, 1.0 / d, eps)
        xp.subtract(x2, mean, out=xhat)
        xp.multiply(xhat, istd, out=xhat)
        xp.sum(dy2, axis=0, out=dbias)
        xp.multiply(dy2, xhat, out=dx2)
        xp.sum(dx2, axis=0, out=dscale)
        # per row: s1 = mean(dY * scale), s2 = mean(dY * scale * x-hat)
        xp.matmul(dy2, scale, out=s1.reshape(r))
        xp.matmul(dx2, scale, out=s2.reshape(r))
        xp.multiply(s1, 1.0 / d, out=s1)
        xp.multiply(s2, 1.0 / d, out=s2)
        # dX = istd * (dY * scale - s1 - x-hat * s2)
        xp.multiply(xhat, s2, out=xhat)
        xp.multiply(dy2, scale, out=dx2)
        xp.subtract(dx2, xhat, out=dx2)
        xp.subtract(dx2, s1, out=dx2)
        xp.multiply(dx2, istd, out=dx2)

    return step


def _import_bn(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
               ) -> tuple[list[str], dict[str, Any]]:
    """The running statistics are state; training updates them in place."""
    ctx.state(ins[3:5])
    if ctx.training:
        attrs.update(training_mode=1, running_update=1)
    return ins, attrs


def _export_bn(n: Node, helper: Any, nh: Any) -> Exported:
    """The inference form, whatever the path did: ``training_mode=0`` and one output, the
    running statistics (the VM's values: initializers) normalising.  A training-mode
    node (several outputs in ONNX, the running ones computed, not updated) is not what
    an exported model runs, and onnxruntime refuses one with a single output."""
    attrs = {"epsilon": float(n.attrs.get("epsilon", 1e-5)),
             "momentum": float(n.attrs.get("momentum", 0.9))}
    return [helper.make_node("BatchNormalization", list(n.inputs[:5]), [n.outputs[0]],
                             **attrs)], []


OPS = [
    OpDef(name="BatchNormalization", shape=_bn_shape, kernel=_bn, grad=_g_bn, workspace=_bn_ws,
          flops=_bn_flops,
          num_inputs=(5, 5), num_outputs=3, variadic_outputs=True, pure=False, writes=(3, 4),
          attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0, "running_update": 0,
                 "spatial": 1, "unbiased": 0}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="BatchNormalization", import_=_import_bn, export=_export_bn,
                        engine_attrs=frozenset({"running_update", "unbiased"})),
          doc="ONNX BatchNormalization; with running_update=1 (training) the running mean "
              "and variance inputs are updated in place; with unbiased=1 the running "
              "variance takes the batch's unbiased variance (PyTorch)"),
    OpDef(name="BatchNormalizationGrad", shape=_bn_grad_shape, kernel=_bn_grad,
          flops=_bn_grad_flops,
          grad=FIRST_ORDER_ONLY, workspace=_bn_grad_ws, num_inputs=(5, 5), num_outputs=3,
          attrs={"epsilon": 1e-5, "training_mode": 0}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL, doc="internal: dX, dScale, dB of BatchNormalization"),
    OpDef(name="LayerNormalization", shape=_ln_shape, kernel=_ln, grad=_g_ln, workspace=_ln_ws,
          flops=_ln_flops,
          num_inputs=(2, 3), num_outputs=3, variadic_outputs=True,
          attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="LayerNormalization"),
          doc="ONNX LayerNormalization over the axes from `axis` on"),
    OpDef(name="LayerNormalizationGrad", shape=_ln_grad_shape, kernel=_ln_grad,
          flops=per_output(LN_GRAD_FLOPS),
          grad=FIRST_ORDER_ONLY, workspace=_ln_grad_ws, num_inputs=(3, 3), num_outputs=3,
          attrs={"axis": -1, "epsilon": 1e-5}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX, dScale, dB of LayerNormalization (Scale and B at the "
              "normalised shape)"),
]


# -- LRN ------------------------------------------------------------------------------------


def _lrn_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    need_float(x, "LRN X")
    if len(x.shape) < 3:
        raise ShapeError(f"LRN needs [N, C, D1, ...], got {x.shape}")
    if int(attrs["size"]) < 1:
        raise ShapeError(f"LRN: size must be at least 1, got {attrs['size']}")
    return [x]


def _lrn_padded(shape: tuple[int, ...], size: int, item: int) -> int:
    """Bytes of the squares padded along the channels (size - 1 more channels)."""
    per_channel = math.prod(shape) // max(shape[1], 1)
    return align_up((shape[1] + size - 1) * per_channel * item)


def _lrn_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return _lrn_padded(ins[0].shape, int(attrs["size"]), ins[0].dtype.itemsize)


def _lrn_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                 ) -> int:
    x = ins[0]
    return _lrn_padded(x.shape, int(attrs["size"]), x.dtype.itemsize) + \
        align_up(x.numel() * x.dtype.itemsize)


def _window_sum(xp: Any, padded: Any, into: Any, size: int, channels: int) -> None:
    """``into[:, c] = sum(padded[:, c + j] for j < size)``: size strided adds."""
    xp.copyto(into, padded[:, 0:channels])
    for j in range(1, size):
        xp.add(into, padded[:, j:j + channels], out=into)


def _lrn_setup(k: KernelArgs, x: Any) -> tuple[int, int, int, Any]:
    size = int(k.attrs["size"])
    c = x.shape[1]
    lo = (size - 1) // 2
    padded = k.scratch(0, (x.shape[0], c + size - 1, *x.shape[2:]), x.dtype)
    return size, c, lo, padded


def _lrn(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    size, c, lo, padded = _lrn_setup(k, x)
    alpha, beta, bias = (float(k.attrs[a]) for a in ("alpha", "beta", "bias"))

    def step() -> None:
        padded.fill(0)
        xp.multiply(x, x, out=padded[:, lo:lo + c])
        _window_sum(xp, padded, y, size, c)  # y as scratch: the sums of squares
        xp.multiply(y, alpha / size, out=y)
        xp.add(y, bias, out=y)
        xp.power(y, -beta, out=y)
        xp.multiply(y, x, out=y)

    return step


def _lrn_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The square, the window's size - 1 adds, the scale, the bias, the power and the
    product with X: 4 + size per element."""
    return (4 + int(attrs["size"])) * ins[0].numel()


def _lrn_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                    ) -> int:
    """Both windows' size - 1 adds, and 11 products, powers and sums: 9 + 2 size per
    element."""
    return (9 + 2 * int(attrs["size"])) * ins[0].numel()


def _g_lrn(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    return [gb.op("LRNGrad", n.inputs[0], g[0], **n.attrs)] if g[0] else [None]


def _lrn_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"LRNGrad: X {ins[0].shape} and dY {ins[1].shape} differ")
    return [ins[0]]


def _lrn_grad(k: KernelArgs) -> Step:
    """dX_i = dY_i D_i^-b - (2ab/size) X_i sum over the channels c whose window holds i
    of dY_c X_c D_c^(-b-1), with D = bias + a/size * (window sum of squares)."""
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    size, c, lo, padded = _lrn_setup(k, x)
    hi = size - 1 - lo
    alpha, beta, bias = (float(k.attrs[a]) for a in ("alpha", "beta", "bias"))
    d = k.scratch(_lrn_padded(tuple(x.shape), size, x.dtype.itemsize), x.shape, x.dtype)

    def step() -> None:
        padded.fill(0)
        xp.multiply(x, x, out=padded[:, lo:lo + c])
        _window_sum(xp, padded, d, size, c)
        xp.multiply(d, alpha / size, out=d)
        xp.add(d, bias, out=d)  # D
        xp.power(d, -beta, out=dx)  # D^-b
        xp.divide(dx, d, out=d)  # D^(-b-1)
        xp.multiply(dx, dy, out=dx)  # the direct term
        xp.multiply(d, dy, out=d)
        xp.multiply(d, x, out=d)  # T = dY X D^(-b-1)
        padded.fill(0)  # the reverse window: channel i gathers c in [i - hi, i + lo]
        xp.copyto(padded[:, hi:hi + c], d)
        _window_sum(xp, padded, d, size, c)
        xp.multiply(d, x, out=d)
        xp.multiply(d, -2.0 * alpha * beta / size, out=d)
        xp.add(dx, d, out=dx)

    return step


OPS += [
    OpDef(name="LRN", shape=_lrn_shape, kernel=_lrn, grad=_g_lrn, workspace=_lrn_ws,
          flops=_lrn_flops,
          attrs={"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": 1}, stacking=NOT_STACKED,
          onnx=OnnxForm(name="LRN"), doc="ONNX LRN: local response normalisation across channels"),
    OpDef(name="LRNGrad", shape=_lrn_grad_shape, kernel=_lrn_grad, grad=FIRST_ORDER_ONLY,
          flops=_lrn_grad_flops,
          workspace=_lrn_grad_ws, num_inputs=(2, 2),
          attrs={"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": 1},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX of LRN from X and dY"),
]
