"""Pooling over 1, 2 or 3 spatial axes: ``MaxPool`` (with its optional ``Indices``
output), ``AveragePool`` and ``GlobalAveragePool`` (ONNX), with their gradients.

A kernel position is one strided view of the (padded) input, of the output's shape, so
a pooling is ``prod(kernel)`` elementwise ``maximum``/``add`` calls into the output,
with no copy of the windows (copying them and reducing the last, tiny axis took five
times as long).  That is the variant ``views``; ``copies`` (``algorithm="copies"``)
copies each position's view into ``[positions, N, C, *out]`` in the workspace and
reduces the leading axis in one call.  The gradients scatter back through the same
views of a padded ``dX``: max pooling only where that position held the window's first
maximum, found by comparing with the output, so nothing more is kept from the forward.

Geometry follows ONNX: explicit ``pads`` or ``auto_pad``, ``dilations``, and
``ceil_mode``, where the last window may run past the padding (never starting in it);
the overhang is filled with -inf (max) or 0 (average) and is never counted.  An
average divides by the window's cells inside the input, or inside input and explicit
padding with ``count_include_pad``: a per-position table, made once.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (1, 1, 5))
>>> y, i = g.path("p", Mode.FORWARD_ONLY).MaxPool(x, kernel_shape=(2,), strides=(2,),
...                                               ceil_mode=1, outputs=2)
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name, i.name]))
>>> vm.set("x", np.array([[[1, 3, 2, 0, 5]]], np.float32)); vm.forward("p")
>>> vm.get(y.name).tolist(), vm.get(i.name).tolist()
([[[3.0, 2.0, 5.0]]], [[[1, 2, 4]]])
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import DType, TensorDesc
from engine.ops import jit
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NOT_STACKED,
    VARIANT_ATTR,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    Variant,
    dispatch_variants,
    is_numpy,
    need_float,
    per_input,
)
from engine.ops._onnx import ENGINE_INTERNAL, OnnxForm

POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": (), "kernel_shape": (),
              "pads": (), "strides": (), "storage_order": 0, "count_include_pad": 0}


def pool_geometry(x: tuple[int, ...], attrs: dict[str, Any]) -> dict[str, Any]:
    """Per spatial axis: kernel, stride, dilation, pads (begin, end), the padded extent
    the windows read (ceil mode may need more than the pads) and the output size."""
    k = tuple(int(v) for v in attrs.get("kernel_shape") or ())
    r = len(x) - 2
    if not 1 <= r <= 3 or len(k) != r:
        raise ShapeError(f"pooling needs [N, C, D1 (, D2, D3)] and a kernel of that many "
                         f"axes; got input {x} and kernel_shape {k}")
    s = tuple(int(v) for v in attrs.get("strides") or (1,) * r)
    d = tuple(int(v) for v in attrs.get("dilations") or (1,) * r)
    if len(s) != r or len(d) != r or min(*s, *d, *k) < 1:
        raise ShapeError(f"pooling: strides {s}, dilations {d}, kernel {k} must be positive, "
                         f"one per spatial axis")
    size = x[2:]
    ext = tuple((kk - 1) * dd + 1 for kk, dd in zip(k, d, strict=True))
    auto = attrs.get("auto_pad", "NOTSET")
    ceil = bool(int(attrs.get("ceil_mode", 0)))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-n // ss) for n, ss in zip(size, s, strict=True))
        total = [max(0, (o - 1) * ss + e - n) for o, ss, e, n in zip(out, s, ext, size,
                                                                    strict=True)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        pads = tuple((b, t - b) for b, t in zip(begin, total, strict=True))
    elif auto in ("VALID", "NOTSET"):
        p = [int(v) for v in attrs.get("pads") or (0,) * (2 * r)] if auto == "NOTSET" \
            else [0] * (2 * r)
        if len(p) != 2 * r or min(p) < 0:
            raise ShapeError(f"pooling pads {tuple(p)}: {2 * r} non-negative values expected")
        pads = tuple((p[i], p[i + r]) for i in range(r))
        sizes = []
        for n, (b, e), ee, ss in zip(size, pads, ext, s, strict=True):
            span = n + b + e - ee
            o = (-(-span // ss) if ceil else span // ss) + 1
            if ceil and (o - 1) * ss >= n + b:  # the last window would start in the padding
                o -= 1
            sizes.append(o)
        out = tuple(sizes)
    else:
        raise ShapeError(f"pooling auto_pad {auto!r}: NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    if min(out) < 1:
        raise ShapeError(f"pooling {x} by kernel {k} (strides {s}, dilations {d}, pads "
                         f"{pads}) leaves no output")
    padded = tuple(max(n + b + e, (o - 1) * ss + ee) for n, (b, e), o, ss, ee
                   in zip(size, pads, out, s, ext, strict=True))
    return {"k": k, "s": s, "d": d, "pads": pads, "padded": padded, "out": out}


def _pool_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x = ins[0]
    if x.dtype not in (DType.FLOAT32, DType.FLOAT64, DType.UINT8, DType.INT8):
        raise ShapeError(f"pooling takes float or 8-bit input, got {x.dtype.value}")
    geo = pool_geometry(x.shape, attrs)
    y = TensorDesc(x.dtype, (*x.shape[:2], *geo["out"]))
    return [y, TensorDesc(DType.INT64, y.shape)]


def _avg_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    return _pool_shape(ins, attrs)[:1]


def _window_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """1 per window element read: the kernel's cells per pooled value (output 0 of a
    pool, the last input, dY, of its gradient)."""
    cells = 1
    for k in attrs["kernel_shape"]:
        cells *= int(k)
    pooled = outs[0] if len(ins) == 1 else ins[-1]
    return pooled.numel() * cells


def _is_padded(x: tuple[int, ...], geo: dict[str, Any]) -> bool:
    return tuple(x[2:]) != geo["padded"]


def _nbytes(shape: tuple[int, ...], item: int) -> int:
    return align_up(math.prod(shape) * item)


def _padded_bytes(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    return _nbytes((*x[:2], *geo["padded"]), item) if _is_padded(x, geo) else 0


def _inner(geo: dict[str, Any], size: tuple[int, ...]) -> tuple[slice, ...]:
    return (slice(None), slice(None), *(slice(b, b + n) for (b, _), n
                                        in zip(geo["pads"], size, strict=True)))


def _padded(xp: Any, x: Any, k: KernelArgs, geo: dict[str, Any], at: int, fill: float
            ) -> tuple[Step | None, Any, int]:
    """A step copying ``x`` into a padded workspace buffer whose border holds ``fill``
    (None, and ``x`` itself, without padding); the buffer; the offset after it."""
    if not _is_padded(tuple(x.shape), geo):
        return None, x, at
    shape = (*x.shape[:2], *geo["padded"])
    buf = k.scratch(at, shape, x.dtype)
    inner = buf[_inner(geo, tuple(x.shape[2:]))]

    def pad() -> None:
        buf.fill(fill)
        xp.copyto(inner, x)

    return pad, buf, at + _nbytes(shape, x.dtype.itemsize)


def _positions(geo: dict[str, Any]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(kk) for kk in geo["k"])))


def _views(buf: Any, geo: dict[str, Any]) -> list[Any]:
    """For each kernel position, the strided view of ``buf`` it reads (or writes)."""
    out = []
    for pos in _positions(geo):
        idx = [slice(None), slice(None)]
        for i, ss, dd, o in zip(pos, geo["s"], geo["d"], geo["out"], strict=True):
            idx.append(slice(i * dd, i * dd + ss * (o - 1) + 1, ss))
        out.append(buf[tuple(idx)])
    return out


def _fill_value(dtype: Any) -> float:
    return float("-inf") if np.dtype(dtype).kind == "f" else float(np.iinfo(dtype).min)


def _pool_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    n = _padded_bytes(x, geo, item) + _nbytes(geo["out"], item)  # + the count table
    if len(outs) > 1:  # Indices: a mask and each kernel position's flat offsets
        n += _nbytes(outs[0].shape, 1) + len(_positions(geo)) * _nbytes(geo["out"], 8)
    return n


def _offsets(geo: dict[str, Any], size: tuple[int, ...], column_major: bool) -> np.ndarray:
    """[positions, *out]: the flat index within one image of the cell each kernel
    position reads at each output position (ONNX's Indices, row- or column-major)."""
    grids = np.meshgrid(*(np.arange(o) for o in geo["out"]), indexing="ij")
    strides = [math.prod(size[i + 1:]) for i in range(len(size))]
    if column_major:
        strides = [math.prod(size[:i]) for i in range(len(size))]
    out = []
    for pos in _positions(geo):
        flat = np.zeros(geo["out"], np.int64)
        for ax, (i, g) in enumerate(zip(pos, grids, strict=True)):
            coord = g * geo["s"][ax] + i * geo["d"][ax] - geo["pads"][ax][0]
            flat += coord * strides[ax]
        out.append(flat)
    return np.stack(out)


def _max_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    pad, buf, at = _padded(xp, x, k, geo, 0, _fill_value(x.dtype))
    views = _views(buf, geo)
    if len(k.outs) == 1:
        return _fold(xp.maximum, xp, y, pad, views)
    indices = k.outs[1]
    at += _nbytes(geo["out"], x.dtype.itemsize)
    mask = k.scratch(at, y.shape, "bool")
    at += _nbytes(y.shape, 1)
    host = np.ascontiguousarray(_offsets(geo, tuple(x.shape[2:]),
                                        bool(int(k.attrs["storage_order"]))), np.int64)
    table = k.scratch(at, host.shape, "int64")
    per_image = math.prod(x.shape[2:])
    base = xp.asarray((np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * per_image)
                      .reshape(x.shape[0], x.shape[1], *(1,) * len(geo["out"])))
    on_host = is_numpy(xp)

    def step() -> None:
        if pad is not None:
            pad()
        upload(table, host, on_host)  # each step: the workspace is shared
        xp.copyto(y, views[0])
        xp.copyto(indices, table[0])
        for j, v in enumerate(views[1:], start=1):
            xp.greater(v, y, out=mask)  # strictly: the first maximum keeps its index
            xp.copyto(y, v, where=mask)
            xp.copyto(indices, table[j], where=mask)
        xp.add(indices, base, out=indices)

    return step


def upload(table: Any, host: np.ndarray, on_host: bool) -> None:
    """``table[...] = host``: on a GPU straight into the table's memory (``xp.asarray``
    would first make a device array of its own at every step)."""
    if on_host:
        table[...] = host
    else:
        table.set(host)


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


def _inverse_counts(geo: dict[str, Any], size: tuple[int, ...], include_pad: bool
                    ) -> np.ndarray:
    """1 / the number of cells each output window averages: inside the input, or inside
    input and explicit pads (never the overhang of ceil mode)."""
    per_axis = []
    for n, (b, e), kk, ss, dd, o in zip(size, geo["pads"], geo["k"], geo["s"], geo["d"],
                                        geo["out"], strict=True):
        lo, hi = (0, n + b + e) if include_pad else (b, b + n)
        per_axis.append(np.array([sum(lo <= q * ss + i * dd < hi for i in range(kk))
                                  for q in range(o)]))
    counts = per_axis[0]
    for c in per_axis[1:]:
        counts = np.multiply.outer(counts, c)
    return 1.0 / counts


def _scale_step(xp: Any, k: KernelArgs, inv: np.ndarray, at: int, target: Any) -> Step:
    """``target *= inv``: a scalar when every window counts alike, else a table of the
    output's spatial shape kept in the workspace (written each step: it is shared)."""
    if np.all(inv == inv.flat[0]):
        value = float(inv.flat[0])
        return lambda: xp.multiply(target, value, out=target)
    table = k.scratch(at, inv.shape, target.dtype)
    host = inv.astype(table.dtype)
    on_host = is_numpy(xp)

    def scale() -> None:
        upload(table, host, on_host)
        xp.multiply(target, table, out=target)

    return scale


def _avg_pool(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    pad, buf, at = _padded(xp, x, k, geo, 0, 0.0)
    total = _fold(xp.add, xp, y, pad, _views(buf, geo))
    inv = _inverse_counts(geo, tuple(x.shape[2:]), bool(int(k.attrs["count_include_pad"])))
    scale = _scale_step(xp, k, inv, at, y)

    def step() -> None:
        total()
        scale()

    return step


# -- window copies: each kernel position's view copied into the workspace, one reduction ----


def _max_copies_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                   device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    windows = len(_positions(geo)) * math.prod((*x[:2], *geo["out"]))
    return _padded_bytes(x, geo, item) + align_up(windows * item)


def _avg_copies_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                   device: str) -> int:  # and the count table
    geo = pool_geometry(ins[0].shape, attrs)
    return _max_copies_ws(ins, outs, attrs, device) + _nbytes(geo["out"], ins[0].dtype.itemsize)


def _windows(k: KernelArgs, geo: dict[str, Any], fill: float
             ) -> tuple[Step, Any, int]:
    """A step copying every kernel position's view into ``[positions, N, C, *out]`` in
    the workspace (after the padded input); the windows; the offset after them."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    pad, buf, at = _padded(xp, x, k, geo, 0, fill)
    views = _views(buf, geo)
    win = k.scratch(at, (len(views), *y.shape), x.dtype)
    at += align_up(win.nbytes)
    pairs = list(zip(views, win, strict=True))

    def copy() -> None:
        if pad is not None:
            pad()
        for v, w in pairs:
            xp.copyto(w, v)

    return copy, win, at


def _max_pool_copies(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    copy, win, _ = _windows(k, geo, _fill_value(x.dtype))

    def step() -> None:
        copy()
        xp.max(win, axis=0, out=y)

    return step


def _avg_pool_copies(k: KernelArgs) -> Step:
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    copy, win, at = _windows(k, geo, 0.0)
    inv = _inverse_counts(geo, tuple(x.shape[2:]), bool(int(k.attrs["count_include_pad"])))
    scale = _scale_step(xp, k, inv, at, y)

    def step() -> None:
        copy()
        xp.sum(win, axis=0, out=y)
        scale()

    return step


def _no_indices(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return len(outs) == 1


def _always(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return True


def _tiles(x: tuple[int, ...], y: tuple[int, ...], geo: dict[str, Any]) -> bool:
    """Whether 2-D windows tile an input of shape ``x`` (output ``y``): stride = kernel,
    no padding, no dilation."""
    return len(x) == 4 and geo["k"] == geo["s"] and geo["d"] == (1, 1) and \
        not any(sum(geo["pads"], ())) and y[2] * geo["k"][0] <= x[2] and \
        y[3] * geo["k"][1] <= x[3]


def _tiles_2x2_shapes(x: tuple[int, ...], outs: list[tuple[int, ...]],
                      attrs: dict[str, Any]) -> bool:
    """2x2 windows tiling a 2-D input, no Indices output: the compiled kernel's case
    (the pooling of most CNNs)."""
    if len(x) != 4 or len(outs) != 1:
        return False
    geo = pool_geometry(x, attrs)
    return geo["k"] == (2, 2) and _tiles(x, outs[0], geo)


def _tiles_2x2(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    """:func:`_tiles_2x2_shapes`, for floats (the variant's ``applies``)."""
    return ins[0].dtype.is_float and _tiles_2x2_shapes(
        tuple(ins[0].shape), [tuple(o.shape) for o in outs], attrs)


def _max_pool_fused(k: KernelArgs) -> Step:
    """The 2x2 compiled kernel; the views' kernel where numba is missing or off, on the
    GPU, or for views that are not contiguous."""
    ks = jit.kernels() if is_numpy(k.xp) else None
    x, y = k.ins[0], k.outs[0]
    if ks is None or x.dtype.kind != "f" or not (x.flags.c_contiguous and
                                                  y.flags.c_contiguous):
        return _max_pool(k)
    run = ks.max_pool_2x2
    return lambda: run(x, y)


MAX_POOL_VARIANTS: dict[str, Variant] = {
    "views": Variant(applies=_always, workspace=_pool_ws, kernel=_max_pool,
                     doc="one strided view per kernel position, folded with maximum"),
    "copies": Variant(applies=_no_indices, workspace=_max_copies_ws, kernel=_max_pool_copies,
                      doc="the windows copied into the workspace, one max over them (no "
                          "Indices output)"),
    "numba": Variant(applies=_tiles_2x2, workspace=_pool_ws, kernel=_max_pool_fused,
                     doc="2x2 windows tiling the input: one compiled pass, the row "
                         "vectorised"),
}
AVG_POOL_VARIANTS: dict[str, Variant] = {
    "views": Variant(applies=_always, workspace=_pool_ws, kernel=_avg_pool,
                     doc="one strided view per kernel position, summed"),
    "copies": Variant(applies=_always, workspace=_avg_copies_ws, kernel=_avg_pool_copies,
                      doc="the windows copied into the workspace, one sum over them"),
}


_MAX_NAMED, _MAX_WS = dispatch_variants("MaxPool", MAX_POOL_VARIANTS)


def _max_kernel(k: KernelArgs) -> Step:
    """The variant the attributes name; by default the compiled 2x2 kernel where it
    applies (3x numpy's views on the MNIST CNN's poolings), else the views."""
    if k.attrs.get(VARIANT_ATTR):
        return _MAX_NAMED(k)
    if _tiles_2x2_shapes(tuple(k.ins[0].shape), [tuple(o.shape) for o in k.outs], k.attrs):
        return _max_pool_fused(k)  # itself the views' kernel where it cannot run
    return _max_pool(k)


_AVG_KERNEL, _AVG_WS = dispatch_variants("AveragePool", AVG_POOL_VARIANTS)


def _pool_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, dy = ins[0], ins[-1]
    if _pool_shape([x], attrs)[0].shape != dy.shape:
        raise ShapeError(f"pooling gradient: dY {dy.shape} is not the output of {x.shape}")
    return [x]


def _dx_bytes(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    """A padded dX is always needed (views of it are written)."""
    return _nbytes((*x[:2], *geo["padded"]), item)


def _max_pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    y = (*x[:2], *geo["out"])
    return _padded_bytes(x, geo, item) + _dx_bytes(x, geo, item) + 3 * _nbytes(y, item)


# MaxPoolGrad on a GPU, 2-D and contiguous: one thread per cell of dX, which sums the dY
# of each window that holds the cell where the cell is the window's first maximum (the
# first position whose value equals Y, as the array calls find it, padding reading the
# fill value); the windows' contributions in the order of their kernel positions, as
# the array calls add them.  No atomics (the sum is deterministic) and one launch where
# the array calls take five a kernel position.
_MAX_POOL_GRAD_2D = (
    "raw T x, raw T y, raw T dy, T fill, int32 H, int32 W, int32 OH, int32 OW, "
    "int32 KH, int32 KW, int32 SH, int32 SW, int32 DH, int32 DW, int32 PH, int32 PW",
    "T dx",
    """
    const long long w = i % W, h = (i / W) % H, nc = i / ((long long)W * H);
    const long long xb = nc * H * W, yb = nc * OH * OW;
    T acc = 0;
    for (int a = 0; a < KH; ++a) {
      const long long t = h + PH - (long long)a * DH;
      if (t < 0 || t % SH) continue;
      const long long oh = t / SH;
      if (oh >= OH) continue;
      for (int b = 0; b < KW; ++b) {
        const long long u = w + PW - (long long)b * DW;
        if (u < 0 || u % SW) continue;
        const long long ow = u / SW;
        if (ow >= OW) continue;
        const T m = y[yb + oh * OW + ow];
        bool mine = false, found = false;
        for (int a2 = 0; a2 < KH && !found; ++a2) {
          const long long h2 = oh * SH - PH + (long long)a2 * DH;
          for (int b2 = 0; b2 < KW; ++b2) {
            const long long w2 = ow * SW - PW + (long long)b2 * DW;
            const bool inside = h2 >= 0 && h2 < H && w2 >= 0 && w2 < W;
            const T v = inside ? x[xb + h2 * W + w2] : fill;
            if (v == m) { mine = a2 == a && b2 == b; found = true; break; }
          }
        }
        if (mine) acc += dy[yb + oh * OW + ow];
      }
    }
    dx = acc;
    """,
    "calcgraph_max_pool_grad_2d")


def _max_pool_grad_device(k: KernelArgs) -> Step | None:
    """:data:`_MAX_POOL_GRAD_2D` where it applies: a GPU, 2-D, floats, contiguous."""
    xp, (x, y, dy), dx = k.xp, k.ins, k.outs[0]
    if is_numpy(xp) or x.ndim != 4 or x.dtype.kind != "f" or \
            not all(a.flags.c_contiguous for a in (x, y, dy, dx)):
        return None
    geo = pool_geometry(tuple(x.shape), k.attrs)
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    ph, pw = geo["pads"][0][0], geo["pads"][1][0]
    kernel = xp.ElementwiseKernel(*_MAX_POOL_GRAD_2D)
    fill = x.dtype.type(_fill_value(x.dtype))
    args = (x, y, dy, fill, *x.shape[2:], *y.shape[2:], kh, kw, sh, sw, dh, dw, ph, pw)
    return lambda: kernel(*args, dx)


def _max_pool_grad(k: KernelArgs) -> Step:
    """dY to each window's first maximum.  The masks are floats (1 or 0), not booleans:
    numpy's ``where=`` on a strided view ran eight times slower than a comparison
    written as floats, two products and a plain strided add.  On a GPU, 2-D, one kernel
    (:data:`_MAX_POOL_GRAD_2D`)."""
    device = _max_pool_grad_device(k)
    if device is not None:
        return device
    xp, (x, y, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    pad, buf, at = _padded(xp, x, k, geo, 0, _fill_value(x.dtype))
    dxp = k.scratch(at, (*x.shape[:2], *geo["padded"]), dx.dtype)
    at += _dx_bytes(tuple(x.shape), geo, dx.dtype.itemsize)
    size = _nbytes(tuple(y.shape), dx.dtype.itemsize)
    hit, free, share = (k.scratch(at + i * size, y.shape, dx.dtype) for i in range(3))
    pairs = list(zip(_views(buf, geo), _views(dxp, geo), strict=True))
    inner = dxp[_inner(geo, tuple(x.shape[2:]))]

    def step() -> None:
        if pad is not None:
            pad()
        dxp.fill(0)
        free.fill(1)  # 1 where the window's maximum is not yet found
        for window, target in pairs:
            xp.equal(window, y, out=hit, casting="unsafe")
            xp.multiply(hit, free, out=hit)  # only the first maximum
            xp.subtract(free, hit, out=free)
            xp.multiply(hit, dy, out=share)
            xp.add(target, share, out=target)
        xp.copyto(dx, inner)

    return step


def _max_pool_grad_fused(k: KernelArgs, ks: Any) -> Step | None:
    """2-D, floats, contiguous: one compiled pass (about twenty numpy passes
    otherwise: five per kernel position and the fills)."""
    (x, y, dy), dx = k.ins, k.outs[0]
    if x.ndim != 4 or not all(a.flags.c_contiguous for a in (x, y, dy, dx)):
        return None
    geo = pool_geometry(tuple(x.shape), k.attrs)
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    ph, pw = geo["pads"][0][0], geo["pads"][1][0]
    tiles = _tiles(x.shape, y.shape, geo)  # windows that tile the input: each cell once
    if tiles and (kh, kw) == (2, 2):
        two = ks.max_pool_grad_2x2  # vectorised along the row
        return lambda: two(x, y, dy, dx)
    if tiles:
        tiled = ks.max_pool_grad_tiled
        return lambda: tiled(x, y, dy, dx, kh, kw)
    kernel = ks.max_pool_grad_2d
    return lambda: kernel(x, y, dy, dx, kh, kw, sh, sw, dh, dw, ph, pw)


MAX_POOL_GRAD = jit.variants(_max_pool_grad, _max_pool_grad_fused, _max_pool_grad_ws,
                             "each window's dY to its first maximum in one compiled pass")


def _avg_pool_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    x, item = ins[0].shape, ins[0].dtype.itemsize
    geo = pool_geometry(x, attrs)
    return (_dx_bytes(x, geo, item) + _nbytes((*x[:2], *geo["out"]), item)
            + _nbytes(geo["out"], item))


def _avg_pool_grad(k: KernelArgs) -> Step:
    xp, (x, dy), dx = k.xp, k.ins, k.outs[0]
    geo = pool_geometry(tuple(x.shape), k.attrs)
    dxp = k.scratch(0, (*x.shape[:2], *geo["padded"]), dx.dtype)
    at = _dx_bytes(tuple(x.shape), geo, dx.dtype.itemsize)
    share = k.scratch(at, dy.shape, dx.dtype)  # dY / count
    at += _nbytes(tuple(dy.shape), dx.dtype.itemsize)
    inv = _inverse_counts(geo, tuple(x.shape[2:]), bool(int(k.attrs["count_include_pad"])))
    scale = _scale_step(xp, k, inv, at, share)
    targets = _views(dxp, geo)
    inner = dxp[_inner(geo, tuple(x.shape[2:]))]

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
    OpDef(name="MaxPool", shape=_pool_shape, kernel=_max_kernel, grad=_g_max_pool,
          flops=_window_flops,
          workspace=_MAX_WS, num_outputs=2, variadic_outputs=True, attrs=dict(POOL_ATTRS),
          variants=MAX_POOL_VARIANTS, stacking=NOT_STACKED,
          onnx=OnnxForm(name="MaxPool", engine_attrs=frozenset({"algorithm"})),
          doc="ONNX MaxPool over 1-3 spatial axes, with the optional Indices output"),
    OpDef(name="AveragePool", shape=_avg_shape, kernel=_AVG_KERNEL, grad=_g_avg_pool,
          flops=_window_flops,
          workspace=_AVG_WS, attrs=dict(POOL_ATTRS), stacking=NOT_STACKED,
          variants=AVG_POOL_VARIANTS,
          onnx=OnnxForm(name="AveragePool", engine_attrs=frozenset({"algorithm"})),
          doc="ONNX AveragePool over 1-3 spatial axes"),
    OpDef(name="GlobalAveragePool", shape=_gap_shape, kernel=_gap, grad=_g_gap,
          flops=per_input(1),
          stacking=NOT_STACKED, onnx=OnnxForm(name="GlobalAveragePool"),
          doc="ONNX GlobalAveragePool: the mean over every spatial axis"),
    OpDef(name="MaxPoolGrad", shape=_pool_grad_shape,
          flops=_window_flops,
          kernel=jit.by_size("MaxPoolGrad", MAX_POOL_GRAD), variants=MAX_POOL_GRAD,
          grad=FIRST_ORDER_ONLY,
          workspace=_max_pool_grad_ws, num_inputs=(3, 3), attrs=dict(POOL_ATTRS),
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dY to each window's first maximum (found by comparing with Y)"),
    OpDef(name="AveragePoolGrad", shape=_pool_grad_shape, kernel=_avg_pool_grad,
          flops=_window_flops,
          grad=FIRST_ORDER_ONLY, workspace=_avg_pool_grad_ws, num_inputs=(2, 2),
          attrs=dict(POOL_ATTRS), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dY / count spread over each window"),
]
