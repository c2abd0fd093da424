"""``ConvTranspose`` (ONNX) over 1, 2 or 3 spatial axes, with its gradients.

The direct form, one GEMM per kernel position: each input cell ``X[n, :, i]`` times
``W[:, :, k]`` lands at ``Y[n, :, s*i + d*k]``, so for a kernel position ``k`` the
products ``X_t [N·S, C] @ W_k [C, M]`` are added into one strided view of a full-size
output ``[N, M, s*(in-1) + d*(k-1) + 1, ...]``, which is then cropped by the pads (a
negative crop, from ``output_padding`` or an ``output_shape`` beyond the full size,
extends the output with zeros).  The gradients are the same views read back:
``dX_t += dY_k @ W_k^T`` and ``dW_k = X_t^T @ dY_k``.  ``X`` and ``W`` are copied once
per step into GEMM-friendly layouts in the workspace; everything the op needs is there.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (1, 1, 3)); w = g.placeholder("w", (1, 1, 2))
>>> y = g.path("t", Mode.FORWARD_ONLY).ConvTranspose(x, w, strides=(2,))
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
>>> vm.set("x", np.array([[[1, 2, 3]]], np.float32)); vm.set("w", np.array([[[1, 10]]], np.float32))
>>> vm.forward("t"); vm.get(y.name).tolist()
[[[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]]]
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
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
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm

ATTRS = {"auto_pad": "NOTSET", "dilations": (), "group": 1, "kernel_shape": (),
         "output_padding": (), "output_shape": (), "pads": (), "strides": ()}


def geometry(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]) -> dict[str, Any]:
    """Per spatial axis: kernel, stride, dilation, the full extent, the crop at each end
    (negative: zeros added) and the output size; plus channels and groups."""
    r = len(x) - 2
    if not 1 <= r <= 3 or len(w) != r + 2:
        raise ShapeError(f"ConvTranspose needs X [N, C, D1 (, D2, D3)] and W [C, M/group, "
                         f"k...] of the same rank; got {x} and {w}")
    g = int(attrs.get("group", 1))
    c, mg = w[0], w[1]
    if g < 1 or x[1] != c or c % g:
        raise ShapeError(f"ConvTranspose: X has {x[1]} channels, W {c} (in {g} groups)")
    k = tuple(w[2:])
    if tuple(attrs.get("kernel_shape") or k) != k:
        raise ShapeError(f"kernel_shape {attrs['kernel_shape']} differs from W's {k}")
    s = tuple(int(v) for v in attrs.get("strides") or (1,) * r)
    d = tuple(int(v) for v in attrs.get("dilations") or (1,) * r)
    op = tuple(int(v) for v in attrs.get("output_padding") or (0,) * r)
    if not len(s) == len(d) == len(op) == r or min(*s, *d) < 1 or min(op) < 0:
        raise ShapeError(f"ConvTranspose: strides {s}, dilations {d}, output_padding {op} "
                         f"must have {r} values (positive; output_padding >= 0)")
    size = x[2:]
    full = tuple(ss * (n - 1) + (kk - 1) * dd + 1 for ss, n, kk, dd in zip(s, size, k, d,
                                                                        strict=True))
    auto = attrs.get("auto_pad", "NOTSET")
    target = tuple(int(v) for v in attrs.get("output_shape") or ())
    if auto in ("SAME_UPPER", "SAME_LOWER") and not target:
        target = tuple(n * ss for n, ss in zip(size, s, strict=True))
    if target:
        if len(target) != r:
            raise ShapeError(f"ConvTranspose: output_shape {target} needs {r} values")
        total = [f + o - t for f, o, t in zip(full, op, target, strict=True)]
        upper = auto == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in total]
    elif auto in ("NOTSET", "VALID"):
        p = [int(v) for v in attrs.get("pads") or (0,) * (2 * r)] if auto == "NOTSET" \
            else [0] * (2 * r)
        if len(p) != 2 * r:
            raise ShapeError(f"ConvTranspose pads {tuple(p)}: {2 * r} values expected")
        pads = [(p[i], p[i + r]) for i in range(r)]
    else:
        raise ShapeError(f"ConvTranspose auto_pad {auto!r}: NOTSET, SAME_UPPER, SAME_LOWER or "
                         "VALID")
    crop = [(b, e - o) for (b, e), o in zip(pads, op, strict=True)]  # output_padding: less crop
    out = tuple(f - b - e for f, (b, e) in zip(full, crop, strict=True))
    if min(out) < 1:
        raise ShapeError(f"ConvTranspose of {x} by {w} leaves no output (pads {pads})")
    # the full result, with room for negative crops on either side
    ext = tuple(f + max(-b, 0) + max(-e, 0) for f, (b, e) in zip(full, crop, strict=True))
    return {"k": k, "s": s, "d": d, "crop": crop, "out": out, "ext": ext, "group": g,
            "c": c, "m": mg * g, "mg": mg}


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    geo = geometry(ins[0].shape, ins[1].shape, attrs)
    if len(ins) == 3 and ins[2].shape != (geo["m"],):
        raise ShapeError(f"ConvTranspose bias must be [{geo['m']}], got {ins[2].shape}")
    return [TensorDesc(dt, (ins[0].shape[0], geo["m"], *geo["out"]))]


def _product_flops(x: TensorDesc, w: TensorDesc) -> int:
    """Each input cell's C channels times W's (M/group)·(kernel cells) per group:
    2·N·(input cells)·C·(M/group)·(kernel cells), whatever the crop keeps."""
    return 2 * x.numel() * math.prod(w.shape[1:])


def _flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The product, and the bias 1 per output element."""
    return _product_flops(ins[0], ins[1]) + (outs[0].numel() if len(ins) == 3 else 0)


def _grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """dX and dW, each the forward's product."""
    return 2 * _product_flops(ins[0], ins[1])


def _parts(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], item: int,
           grad: bool) -> list[int]:
    """Workspace pieces: X_t, W_t, one kernel position's product, the full output (or
    dY placed in it); for the gradient also dX_t, a group's dX part and dW_t."""
    geo = geometry(x, w, attrs)
    n, cells = x[0], math.prod(x[2:])
    parts = [n * cells * geo["c"], math.prod(w), n * cells * geo["mg"],
             n * geo["m"] * math.prod(geo["ext"])]
    if grad:
        parts += [n * cells * geo["c"], n * cells * (geo["c"] // geo["group"]), math.prod(w)]
    return [align_up(p * item) for p in parts]


def _ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return sum(_parts(ins[0].shape, ins[1].shape, attrs, ins[0].dtype.itemsize, False))


class _Layout:
    """Views shared by the forward and the gradient kernels."""

    def __init__(self, k: KernelArgs, x: Any, w: Any, grad: bool) -> None:
        geo = self.geo = geometry(tuple(x.shape), tuple(w.shape), k.attrs)
        sizes = _parts(tuple(x.shape), tuple(w.shape), k.attrs, x.dtype.itemsize, grad)
        at = [sum(sizes[:i]) for i in range(len(sizes))]
        n, c, g, mg = x.shape[0], geo["c"], geo["group"], geo["mg"]
        cg, r = c // g, x.ndim - 2
        cells = math.prod(x.shape[2:])
        self.rows = n * cells
        self.xt = k.scratch(at[0], (n, *x.shape[2:], c), x.dtype)
        self.x_t = x.transpose(0, *range(2, r + 2), 1)  # [N, *S, C], a view
        kpos = list(itertools.product(*(range(kk) for kk in geo["k"])))
        self.kpos = kpos
        # W_t[g, p] = W[g*Cg:(g+1)*Cg, :, p] as [Cg, Mg], contiguous
        self.wt = k.scratch(at[1], (g, len(kpos), cg, mg), x.dtype)
        self.w_t = w.reshape(g, cg, mg, len(kpos)).transpose(0, 3, 1, 2)
        self.prod = k.scratch(at[2], (self.rows, mg), x.dtype)
        self.full = k.scratch(at[3], (n, geo["m"], *geo["ext"]), x.dtype)
        start = [max(-b, 0) for b, _ in geo["crop"]]  # where the full result begins
        self.out_view = self.full[(slice(None), slice(None),
                                   *(slice(max(b, 0), max(b, 0) + o)
                                     for (b, _), o in zip(geo["crop"], geo["out"],
                                                          strict=True)))]
        # for each kernel position and group: the strided view of the full output it
        # adds to, seen as [N, *S, Mg] to match the product's layout
        self.targets = []
        for p in kpos:
            idx = [slice(None), None]
            for ax, (i, ss, dd) in enumerate(zip(p, geo["s"], geo["d"], strict=True)):
                a = start[ax] + i * dd
                idx.append(slice(a, a + ss * (x.shape[2 + ax] - 1) + 1, ss))
            per_group = []
            for gi in range(g):
                idx[1] = slice(gi * mg, (gi + 1) * mg)
                per_group.append(self.full[tuple(idx)].transpose(0, *range(2, r + 2), 1))
            self.targets.append(per_group)
        self.xg = [self.xt.reshape(self.rows, c)[:, gi * cg:(gi + 1) * cg] for gi in range(g)]
        self.prod_nd = self.prod.reshape(n, *x.shape[2:], mg)
        self.at = at
        self.cg = cg


def _kernel(k: KernelArgs) -> Step:
    xp, x, w, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    lay = _Layout(k, x, w, grad=False)
    bias = k.ins[2].reshape(1, -1, *(1,) * (x.ndim - 2)) if len(k.ins) > 2 else None
    g = lay.geo["group"]

    def step() -> None:
        xp.copyto(lay.xt, lay.x_t)
        xp.copyto(lay.wt, lay.w_t)
        lay.full.fill(0)
        for j, per_group in enumerate(lay.targets):
            for gi in range(g):
                xp.matmul(lay.xg[gi], lay.wt[gi, j], out=lay.prod)
                xp.add(per_group[gi], lay.prod_nd, out=per_group[gi])
        xp.copyto(y, lay.out_view)
        if bias is not None:
            xp.add(y, bias, out=y)

    return step


def _g(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    x, w = n.inputs[:2]
    dx = gb.op("ConvTransposeGrad", x, w, g[0], **n.attrs)
    out: list[str | None] = [dx, f"{dx}:1"]
    if len(n.inputs) == 3:
        rank = len(gb.desc(g[0]).shape)
        out.append(gb.op("ReduceSum", g[0], axes=(0, *range(2, rank)), keepdims=0))
    return out


def _grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, w, dy = ins
    if _shape([x, w], attrs)[0].shape != dy.shape:
        raise ShapeError(f"ConvTransposeGrad: dY {dy.shape} is not the output of {x.shape}")
    return [x, w]


def _grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return sum(_parts(ins[0].shape, ins[1].shape, attrs, ins[0].dtype.itemsize, True))


def _grad(k: KernelArgs) -> Step:
    """dY placed in the full-size buffer; per kernel position and group, its view
    copied out as [N·S, Mg]: dX_t += that @ W_k^T, dW_k = X_t^T @ that."""
    xp, (x, w, dy), (dx, dw) = k.xp, k.ins, k.outs
    lay = _Layout(k, x, w, grad=True)
    at, g, cg = lay.at, lay.geo["group"], lay.cg
    n, c, r = x.shape[0], lay.geo["c"], x.ndim - 2
    dxt = k.scratch(at[4], (lay.rows, c), x.dtype)
    part = k.scratch(at[5], (lay.rows, cg), x.dtype)
    dwt = k.scratch(at[6], lay.wt.shape, x.dtype)
    dxg = [dxt[:, gi * cg:(gi + 1) * cg] for gi in range(g)]
    dx_t = dx.transpose(0, *range(2, r + 2), 1).reshape(n, *x.shape[2:], c)
    dw_t = dw.reshape(g, cg, lay.geo["mg"], len(lay.kpos)).transpose(0, 3, 1, 2)

    def step() -> None:
        xp.copyto(lay.xt, lay.x_t)
        xp.copyto(lay.wt, lay.w_t)
        lay.full.fill(0)
        xp.copyto(lay.out_view, dy)
        dxt.fill(0)
        for j, per_group in enumerate(lay.targets):
            for gi in range(g):
                xp.copyto(lay.prod_nd, per_group[gi])  # dY at this kernel position
                xp.matmul(lay.prod, lay.wt[gi, j].T, out=part)
                xp.add(dxg[gi], part, out=dxg[gi])
                xp.matmul(lay.xg[gi].T, lay.prod, out=dwt[gi, j])
        xp.copyto(dx_t, dxt.reshape(dx_t.shape))
        xp.copyto(dw_t, dwt)

    return step


OPS = [
    OpDef(name="ConvTranspose", shape=_shape, kernel=_kernel, grad=_g, workspace=_ws,
          flops=_flops,
          num_inputs=(2, 3), attrs=dict(ATTRS), stacking=NOT_STACKED,
          onnx=OnnxForm(name="ConvTranspose"),
          doc="ONNX ConvTranspose over 1-3 spatial axes: one GEMM per kernel position"),
    OpDef(name="ConvTransposeGrad", shape=_grad_shape, kernel=_grad, grad=FIRST_ORDER_ONLY,
          flops=_grad_flops,
          workspace=_grad_ws, num_inputs=(3, 3), num_outputs=2, attrs=dict(ATTRS),
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dX and dW of ConvTranspose"),
]
