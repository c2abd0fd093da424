"""2-D convolution (ONNX ``Conv``) and its gradients, by im2col and one GEMM.

Layouts: ``X`` is ``[N, C, H, W]`` (N the batch), ``W`` is ``[M, C/group, kH, kW]``,
the optional bias ``B`` is ``[M]``, ``Y`` is ``[N, M, oH, oW]``.  Every step works in
the workspace, whose size the compiler gets from :func:`_conv_ws` at the planned batch:

- the padded input ``[N, C, Hp, Wp]`` (only when there is padding);
- the columns ``[C·kH·kW, N·oH·R]`` (``R``, the row width: ``oW``, or ``Wp`` for the
  wide rows below): one copy of the input's windows, taken through a strided view (no
  allocation), laid out so that the whole batch is **one** GEMM per group,
  ``W_g @ columns_g``;
- the product ``[M, N·oH·R]``, copied into ``Y``'s layout (the bias added there).

Other forward algorithms (``algorithm="direct"`` or ``"winograd"``) are in
:mod:`engine.ops.conv_algorithms`; each has its own workspace rule.

The weight gradient is the same GEMM the other way round (columns recomputed, not
stored).  The input gradient, at stride 1 on the CPU, is itself a convolution, of dY
padded by ``d·(k-1) - p`` with the flipped kernel (:func:`transposed_conv`), taken by
the forward's im2col; elsewhere it is ``W^T @ dY`` scattered back by kH·kW strided
adds (col2im).

**A few images at a time** (on the CPU): where the whole batch's columns would be more
than :data:`CHUNK_BYTES`, each op takes them for a chunk of the batch's images at a
time (:func:`images_per_chunk`), the same workspace reused chunk after chunk, and the
weight gradient sums the chunks' products.  Columns that stay in the cache cost less
to write and to read back than one copy of the whole batch's (a 32-channel 5x5
convolution of 64 images of 14x14 writes 52 MB of columns), and the workspace, which
the compiler sizes for the largest chunk, shrinks by the same factor.  On a GPU the
batch is one GEMM, as wide as it comes.

**Wide rows** (stride 1): the columns' rows are taken ``Wp`` (the padded width) long
instead of ``oW``, so that each kernel position's columns are one contiguous run of the
padded input, ``(oH-1)·Wp + oW`` long, shifted by ``i·dH·Wp + j·dW``: the copy (and
col2im's adds) move a few long runs instead of ``N·C·oH`` runs of ``oW``, numpy's cost
per run being what dominated at small widths.  The ``Wp - oW`` columns at the end of
each row read the next row's start: the GEMM computes them and the copy into ``Y``
drops them (the gradients see zeros there; an infinite input value read there makes
the weight gradient NaN where narrow rows give an infinity: a diverged step either
way).  The GEMM grows by ``Wp/oW``.  Which op
uses them (:func:`wide_rows`) was measured on 12 shapes (``docs/measurements.md``).
"""

from __future__ import annotations

import math
from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
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
    need_float,
    pick_variant,
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL, ImportContext, OnnxForm

CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": (), "group": 1, "kernel_shape": (),
              "pads": (), "strides": (), "algorithm": "im2col"}


def conv_geometry(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
                  ) -> dict[str, Any]:
    """Kernel, strides, dilations, pads (top, left, bottom, right) and output size."""
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"Conv supports 2-D images: X [N, C, H, W] and W [M, C/g, kH, kW]; "
                         f"got {x} and {w}")
    group = int(attrs.get("group", 1))
    _, c, h, wd = x
    m, cg, kh, kw = w
    if tuple(attrs.get("kernel_shape") or (kh, kw)) != (kh, kw):
        raise ShapeError(f"kernel_shape {attrs['kernel_shape']} differs from W's {(kh, kw)}")
    if group < 1 or c % group or m % group or cg * group != c:
        raise ShapeError(f"Conv: {c} input channels, {m} filters of {cg} channels and group "
                         f"{group} do not agree")
    sh, sw = tuple(attrs.get("strides") or (1, 1))
    dh, dw = tuple(attrs.get("dilations") or (1, 1))
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # dilated kernel extent
    auto = attrs.get("auto_pad", "NOTSET")
    pads: tuple[int, ...]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        oh, ow = -(-h // sh), -(-wd // sw)
        ph, pw = max(0, (oh - 1) * sh + eh - h), max(0, (ow - 1) * sw + ew - wd)
        first = (ph // 2, pw // 2) if auto == "SAME_UPPER" else (ph - ph // 2, pw - pw // 2)
        pads = (first[0], first[1], ph - first[0], pw - first[1])
    elif auto == "VALID":
        pads = (0, 0, 0, 0)
    elif auto == "NOTSET":
        pads = tuple(int(p) for p in (attrs.get("pads") or (0, 0, 0, 0)))
        if len(pads) != 4 or min(pads) < 0:
            raise ShapeError(f"Conv pads {pads}: four non-negative values expected")
    else:
        raise ShapeError(f"Conv auto_pad {auto!r}: NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    hp, wp = h + pads[0] + pads[2], wd + pads[1] + pads[3]
    oh, ow = (hp - eh) // sh + 1, (wp - ew) // sw + 1
    if min(sh, sw, dh, dw) < 1 or oh < 1 or ow < 1:
        raise ShapeError(f"Conv of {x} by {w} (strides {(sh, sw)}, dilations {(dh, dw)}, pads "
                         f"{pads}) leaves no output")
    return {"group": group, "k": (kh, kw), "s": (sh, sw), "d": (dh, dw), "pads": pads,
            "padded": (hp, wp), "out": (oh, ow), "c": c, "m": m, "cg": cg}


def _conv_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    x, w = ins[0].shape, ins[1].shape
    geo = conv_geometry(x, w, attrs)
    if len(ins) == 3 and ins[2].shape != (geo["m"],):
        raise ShapeError(f"Conv bias must be [{geo['m']}], got {ins[2].shape}")
    outs = [TensorDesc(dt, (x[0], geo["m"], *geo["out"]))]
    variant = pick_variant("Conv", VARIANTS, attrs)
    if not variant.applies(ins, outs, attrs):
        raise ShapeError(f"Conv algorithm {attrs.get(VARIANT_ATTR)!r}: {variant.doc}; got kernel "
                         f"{geo['k']}, strides {geo['s']}, dilations {geo['d']}, group "
                         f"{geo['group']}")
    return outs


def _conv_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """2·(C/group)·kH·kW per output element (N·M·oH·oW of them), and the bias 1 each.
    Every variant counts this (Winograd's fewer multiplications included): MFU counts
    the convolution's arithmetic, not the algorithm's."""
    w, y = ins[1].shape, outs[0].numel()
    return 2 * y * w[1] * w[2] * w[3] + (y if len(ins) == 3 else 0)


def _grad_weight_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                       ) -> int:
    """The forward product's 2·N·M·oH·oW·(C/group)·kH·kW (dY input 1, dW the output)."""
    w = outs[0].shape
    return 2 * ins[1].numel() * w[1] * w[2] * w[3]


def _grad_input_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                      ) -> int:
    """The forward product's 2·N·M·oH·oW·(C/group)·kH·kW (W input 0, dY input 1); col2im's
    adds are that product's accumulation, not counted again."""
    w = ins[0].shape
    return 2 * ins[1].numel() * w[1] * w[2] * w[3]


def wide_rows(op: str, geo: dict[str, Any]) -> bool:
    """Whether ``op`` (Conv, ConvGradWeight or ConvGradInput) takes its columns with
    wide rows (the module's docstring): only at stride 1, and only where the rows grow
    by 60% at most (a kernel nearly as wide as its input, such as a classifier written
    as a 6x6 convolution of a 6x6 map, would make the GEMM and its workspace several
    times larger, and the op several times slower).  Measured on two cores
    (``docs/measurements.md``; 12 shapes, batch 8-64, 1-64 channels, widths 7-56, rows
    growing by 1.07-1.29x): the forward gained 5-25% at every shape; the input gradient
    10-40% from two channels a group (it lost 10% with one); the weight gradient, whose
    GEMM is the larger part, only for rows of up to 16 (it lost 5-10% for single-digit
    channel counts at widths 28-32).  At 7x7 with a 5x5 kernel (rows of 11 for 7: 1.57x),
    on one core over five layers of 8-32 channels, the three ops took 0-45% less with
    wide rows, the narrow rows' copy of runs of 7 costing more than the larger GEMM."""
    ow, wp = geo["out"][1], geo["padded"][1]
    if geo["s"] != (1, 1) or 5 * (wp - ow) > 3 * ow:
        return False
    if op == "ConvGradInput":
        return bool(geo["cg"] >= 2)
    if op == "ConvGradWeight":
        return bool(ow <= 16)
    return True


def row_width(geo: dict[str, Any], wide: bool) -> int:
    """The length of the columns' rows: the padded width when wide, else ``oW``."""
    return int(geo["padded"][1]) if wide else int(geo["out"][1])


CHUNK_BYTES = 2 << 20
"""The most bytes of columns an op takes at once on the CPU (module docstring): a few
images' worth for a large convolution, about what a core's caches hold.  Measured by
``bench/conv_chunks.py`` (``docs/measurements.md``): over four layers of the MNIST CNN
space, a convolution and its two gradients took 21-33% less time in chunks of 2 MiB
than the whole batch at once; 1 MiB was within 5% of 2 either way, 4 MiB 1.5% faster
on the 5x5 layer and up to 15% slower on the 3x3 ones, 8 and 16 MiB slower still."""


def images_per_chunk(op: str, geo: dict[str, Any], n: int, item: int, device: str) -> int:
    """How many of the batch's ``n`` images ``op`` (Conv, ConvGradWeight or
    ConvGradInput) takes its columns for at a time: all of them on a GPU or where they
    fit :data:`CHUNK_BYTES`, else as few chunks as fit it, alike in size (31 images'
    columns fitting, a batch of 64 goes as 22, 22 and 20, not 31, 31 and 2).

    >>> geo = conv_geometry((64, 16, 14, 14), (32, 16, 3, 3), {"pads": (1, 1, 1, 1)})
    >>> images_per_chunk("Conv", geo, 64, 4, "cpu"), images_per_chunk("Conv", geo, 64, 4, "gpu")
    (16, 64)
    """
    fit = most_images_per_chunk(op, geo, n, item, device)
    return -(-n // -(-n // fit))


def most_images_per_chunk(op: str, geo: dict[str, Any], n: int, item: int, device: str
                          ) -> int:
    """The most images whose columns fit :data:`CHUNK_BYTES` (all ``n`` on a GPU): the
    chunk the workspace is sized for.  A program compiled for a batch of ``n`` also
    binds smaller batches (the last mini-batch), whose chunks, alike in size, may be
    larger than the compiled batch's (64 images 17 at a time go as four chunks of 16,
    51 as three of 17), but never larger than this."""
    if device != "cpu":
        return n
    per = geo["c"] * geo["k"][0] * geo["k"][1] * geo["out"][0] * \
        row_width(geo, wide_rows(op, geo)) * item
    return max(1, min(n, CHUNK_BYTES // per))


def chunks(n: int, per: int) -> list[tuple[int, int]]:
    """The batch's images ``[lo, hi)`` chunk by chunk, ``per`` at a time (the last may
    have fewer).

    >>> chunks(7, 3), chunks(4, 4)
    ([(0, 3), (3, 6), (6, 7)], [(0, 4)])
    """
    return [(lo, min(n, lo + per)) for lo in range(0, n, per)]


def _ws_parts(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], item: int,
              op: str, device: str) -> tuple[int, int, int, dict[str, Any], int]:
    """Bytes of (padded input, columns, product) of the largest chunk of images any
    batch up to X's binds, aligned, for a concrete X shape; the geometry; the images in
    that chunk (:func:`most_images_per_chunk`)."""
    geo = conv_geometry(x, w, attrs)
    n = most_images_per_chunk(op, geo, x[0], item, device)
    kk = geo["k"][0] * geo["k"][1]
    rows = n * geo["out"][0] * row_width(geo, wide_rows(op, geo))
    cols = geo["c"] * kk * rows
    padded = n * geo["c"] * geo["padded"][0] * geo["padded"][1] if any(geo["pads"]) else 0
    prod = geo["m"] * rows
    return align_up(padded * item), align_up(cols * item), align_up(prod * item), geo, n


def _im2col_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
               ) -> int:
    a, b, c, _, _ = _ws_parts(ins[0].shape, ins[1].shape, attrs, ins[0].dtype.itemsize,
                              "Conv", device)
    return a + b + c


def _conv_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return pick_variant("Conv", VARIANTS, attrs).workspace(ins, outs, attrs, device)


def padded_copy(xp: Any, x: Any, ws: Any, geo: dict[str, Any], at: int, fill: float
                ) -> tuple[Step | None, Any, int]:
    """A step copying ``x`` into a padded workspace buffer whose border holds ``fill``
    (None, and ``x`` itself, without padding); the buffer; the offset after it."""
    pads, (hp, wp) = geo["pads"], geo["padded"]
    if not any(pads):
        return None, x, at
    n, c, item = x.shape[0], x.shape[1], x.dtype.itemsize
    buf = ws[at: at + n * c * hp * wp * item].view(x.dtype).reshape(n, c, hp, wp)
    inner = buf[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]]

    def pad() -> None:
        buf.fill(fill)
        xp.copyto(inner, x)

    return pad, buf, at + align_up(n * c * hp * wp * item)


def _im2col(xp: Any, x: Any, ws: Any, geo: dict[str, Any], at: int, wide: bool
            ) -> tuple[Step, Any, int, int]:
    """A step filling columns ``[C·kH·kW, N·oH·R]`` from ``x``, ``R`` the row width
    (:func:`row_width`); the columns view; ``R``; the workspace offset after the
    scratch used.  ``wide`` falls back to ``oW`` rows where ``x`` is not contiguous (the
    workspace, sized for wide rows, holds either)."""
    n, c = x.shape[0], x.shape[1]
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    oh, ow = geo["out"]
    item = x.dtype.itemsize
    pad, src, at = padded_copy(xp, x, ws, geo, at, 0.0)
    wide = wide and bool(src.flags.c_contiguous)
    steps = [pad] if pad is not None else []
    r = row_width(geo, wide)
    cols = ws[at: at + c * kh * kw * n * oh * r * item].view(x.dtype) \
        .reshape(c, kh, kw, n, oh, r)
    at += align_up(c * kh * kw * n * oh * r * item)
    if wide:  # each kernel position's columns: one run of the flat padded input
        hp, wp = src.shape[2], src.shape[3]
        run = (oh - 1) * wp + ow
        flat = cols.reshape(c, kh, kw, n, oh * wp)
        windows = xp.lib.stride_tricks.as_strided(
            src.reshape(-1), shape=(c, kh, kw, n, run),
            strides=(hp * wp * item, dh * wp * item, dw * item, c * hp * wp * item, item))
        head, tail = flat[..., :run], flat[..., run:]
        steps.append(lambda: xp.copyto(head, windows))
        if tail.size:  # the last row's end, past the input: zeros, as the gradients need
            steps.append(lambda: tail.fill(0))
    else:
        s0, s1, s2, s3 = src.strides
        windows = xp.lib.stride_tricks.as_strided(
            src, shape=(c, kh, kw, n, oh, ow),
            strides=(s1, s2 * dh, s3 * dw, s0, s2 * sh, s3 * sw))
        steps.append(lambda: xp.copyto(cols, windows))

    def run_steps() -> None:
        for f in steps:
            f()

    return run_steps, cols.reshape(c * kh * kw, n * oh * r), r, at


def _dy_rows(xp: Any, dy: Any, dyt: Any, ow: int) -> Step:
    """A step copying ``dY [N, M, oH, oW]`` into ``dyt [M, N, oH, R]`` (zeros in the
    columns past ``oW`` of wide rows)."""
    dy_t = dy.transpose(1, 0, 2, 3)
    if dyt.shape[3] == ow:
        return lambda: xp.copyto(dyt, dy_t)
    body, rest = dyt[..., :ow], dyt[..., ow:]

    def step() -> None:
        rest.fill(0)
        xp.copyto(body, dy_t)

    return step


def _conv(k: KernelArgs) -> Step:
    return pick_variant("Conv", VARIANTS, k.attrs).kernel(k)


def _im2col_chunks(k: KernelArgs, x: Any, geo: dict[str, Any], op: str
                   ) -> tuple[list[tuple[int, int, Step, Any, int]], int, int]:
    """``op``'s im2col chunk by chunk of ``x``'s images (:func:`images_per_chunk`), each
    chunk's columns in the same workspace: each chunk's images ``[lo, hi)`` with its
    im2col step, columns and their row width; the workspace offset after the largest
    chunk's; the images per chunk."""
    n = x.shape[0]
    per = images_per_chunk(op, geo, n, x.dtype.itemsize, k.device)
    parts, end = [], 0
    for lo, hi in chunks(n, per):
        fill, cols, r, at = _im2col(k.xp, x[lo:hi], k.ws, geo, 0, wide_rows(op, geo))
        parts.append((lo, hi, fill, cols, r))
        end = max(end, at)
    return parts, end, per


def _im2col_start(k: KernelArgs) -> tuple[Any, Any, Any, Any, dict[str, Any],
                                          list[tuple[int, int, Step, Any, int]], int]:
    """What both GEMM layouts begin with: (x, w, bias or None, y, the geometry, each
    chunk's images with its im2col step, columns and row width, the workspace offset
    after the largest chunk's columns: :func:`_im2col_chunks`)."""
    x, w = k.ins[0], k.ins[1]
    geo = conv_geometry(tuple(x.shape), tuple(w.shape), k.attrs)
    parts, end, _ = _im2col_chunks(k, x, geo, "Conv")
    return x, w, k.ins[2] if len(k.ins) == 3 else None, k.outs[0], geo, parts, end


def _im2col_conv(k: KernelArgs) -> Step:
    xp = k.xp
    x, w, b, y, geo, parts, at = _im2col_start(k)
    g, m, (oh, ow) = geo["group"], geo["m"], geo["out"]
    wm = w.reshape(m, -1)  # [M, C/g·kH·kW]
    mg, ckk = m // g, wm.shape[1]
    runs = []
    for lo, hi, fill, cols, r in parts:
        # The product as [N·oH·R, M]: the bias then broadcasts along rows, which numpy
        # does without a buffer (along a stride-0 inner axis it buffered the output).
        prod = k.scratch(at, ((hi - lo) * oh * r, m), x.dtype)
        gemms = [(cols[i * ckk:(i + 1) * ckk].T, wm[i * mg:(i + 1) * mg].T,
                  prod[:, i * mg:(i + 1) * mg]) for i in range(g)]
        prod_nchw = prod.reshape(hi - lo, oh, r, m)[:, :, :ow].transpose(0, 3, 1, 2)
        runs.append((fill, gemms, prod, prod_nchw, y[lo:hi]))

    def step() -> None:
        for fill, gemms, prod, prod_nchw, y_part in runs:
            fill()
            for a, c, out in gemms:
                xp.matmul(a, c, out=out)
            if b is not None:
                xp.add(prod, b, out=prod)
            xp.copyto(y_part, prod_nchw)

    return step


def _im2col_tn(k: KernelArgs) -> Step:
    """im2col with the GEMM the other way round: ``W_g [M/g, C/g·kH·kW] @ columns_g``
    into a product ``[M, N·oH·R]``, whose copy into ``Y`` moves whole rows (the ``nt``
    product is copied one element of M at a time); the bias is added to ``Y``."""
    xp = k.xp
    x, w, b, y, geo, parts, at = _im2col_start(k)
    g, m, (oh, ow) = geo["group"], geo["m"], geo["out"]
    wm = w.reshape(m, -1)
    mg, ckk = m // g, wm.shape[1]
    runs = []
    for lo, hi, fill, cols, r in parts:
        prod = k.scratch(at, (m, (hi - lo) * oh * r), x.dtype)
        gemms = [(wm[i * mg:(i + 1) * mg], cols[i * ckk:(i + 1) * ckk],
                  prod[i * mg:(i + 1) * mg]) for i in range(g)]
        prod_nchw = prod.reshape(m, hi - lo, oh, r)[..., :ow].transpose(1, 0, 2, 3)
        runs.append((fill, gemms, prod_nchw, y[lo:hi]))
    bias = b.reshape(1, m, 1, 1) if b is not None else None

    def step() -> None:
        for fill, gemms, prod_nchw, y_part in runs:
            fill()
            for a, c, out in gemms:
                xp.matmul(a, c, out=out)
            xp.copyto(y_part, prod_nchw)
        if bias is not None:
            xp.add(y, bias, out=y)

    return step


def _grad_weight_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    x, dy = ins[0].shape, ins[1].shape
    w = tuple(attrs["w_shape"])
    geo = conv_geometry(x, w, attrs)
    if dy[1:] != (geo["m"], *geo["out"]):
        raise ShapeError(f"ConvGradWeight: dY {dy} does not match the convolution's output")
    return [TensorDesc(ins[0].dtype, w)]


def _grad_weight_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                    ) -> int:
    x, w = ins[0].shape, tuple(attrs["w_shape"])
    item = ins[0].dtype.itemsize
    a, b, c, _, per = _ws_parts(x, w, attrs, item, "ConvGradWeight", device)
    # a later chunk's product, added to the first's in dW
    summed = align_up(w[0] * w[1] * w[2] * w[3] * item) if per < x[0] else 0
    return a + b + c + summed


def _conv_grad_weight(k: KernelArgs) -> Step:
    """dW[g] = dY_g [M/g, N·oH·R] @ columns_g^T (zeros in dY's wide columns), chunk by
    chunk of images: the first chunk's product into dW, each later one's added."""
    xp, x, dy, dw = k.xp, k.ins[0], k.ins[1], k.outs[0]
    geo = conv_geometry(tuple(x.shape), tuple(dw.shape), k.attrs)
    g, m, (oh, ow) = geo["group"], geo["m"], geo["out"]
    parts, end, per = _im2col_chunks(k, x, geo, "ConvGradWeight")
    dwm = dw.reshape(m, -1)
    mg, ckk = m // g, dwm.shape[1]
    rows = per * oh * parts[0][4]
    summed = k.scratch(end + align_up(m * rows * x.dtype.itemsize), dwm.shape, x.dtype) \
        if len(parts) > 1 else None
    runs = []
    for index, (lo, hi, fill, cols, r) in enumerate(parts):
        first = index == 0
        dyt = k.scratch(end, (m, hi - lo, oh, r), x.dtype)  # dY as [M, N·oH·R]
        dyt_m = dyt.reshape(m, (hi - lo) * oh * r)
        into = dwm if first or summed is None else summed
        gemms = [(dyt_m[i * mg:(i + 1) * mg], cols[i * ckk:(i + 1) * ckk].T,
                  into[i * mg:(i + 1) * mg]) for i in range(g)]
        runs.append((fill, _dy_rows(xp, dy[lo:hi], dyt, ow), gemms, not first))

    def step() -> None:
        for fill, copy_dy, gemms, add in runs:
            fill()
            copy_dy()
            for a, c, out in gemms:
                xp.matmul(a, c, out=out)
            if add:
                xp.add(dwm, summed, out=dwm)

    return step


def _grad_input_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    w, dy = ins[0].shape, ins[1].shape
    x = (dy[0], *tuple(attrs["x_shape"])[1:])
    geo = conv_geometry(x, w, attrs)
    if dy[1:] != (geo["m"], *geo["out"]):
        raise ShapeError(f"ConvGradInput: dY {dy} does not match the convolution's output")
    return [TensorDesc(ins[1].dtype, x)]


def _grad_input_parts(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any],
                      item: int, device: str) -> tuple[int, int, int, dict[str, Any], int]:
    """Bytes of the largest chunk's (padded dX, columns' gradient, dY's rows) any batch
    up to X's binds, aligned; the geometry; the images in that chunk."""
    geo = conv_geometry(x, w, attrs)
    n = most_images_per_chunk("ConvGradInput", geo, x[0], item, device)
    padded = n * geo["c"] * geo["padded"][0] * geo["padded"][1]
    kk = geo["k"][0] * geo["k"][1]
    rows = n * geo["out"][0] * row_width(geo, wide_rows("ConvGradInput", geo))
    dcols = geo["c"] * kk * rows
    dyt = geo["m"] * rows
    return align_up(padded * item), align_up(dcols * item), align_up(dyt * item), geo, n


def transposed_conv(x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any],
                    device: str) -> tuple[tuple[int, ...], dict[str, Any]] | None:
    """The convolution that gives the input gradient of ``X * W`` (``attrs``'s), where
    ConvGradInput takes that form: the shape of its weights (``W`` flipped, its channel
    axes swapped per group: ``[C, M/g, kH, kW]``) and its attributes (stride 1, the
    same dilations and group, pads ``d·(k-1) - p``); None where it does not (a stride
    above 1, pads wider than the dilated kernel, more than twice as many filters as
    input channels, or a GPU: col2im there).

    At stride 1, ``dX[y] = Σ_i dY[y + p - d·i] · W[i]``: a convolution of dY padded by
    ``d·(k-1) - p`` with the flipped kernel.  Its im2col is one copy of dY's windows
    where col2im adds kH·kW strided products back into dX, but its columns are of dY's
    M channels where col2im's are of dX's C.  Timed on one core at batch 64 over 14
    layers of the MNIST CNN space (``bench/conv_grad_input.py``,
    ``docs/measurements.md``): 1.6-3.4x faster where M ≤ C, 1.0-1.25x where M = 2C,
    0.75-1.05x where M = 4C (the copy of four times the columns outweighs the adds
    saved).

    >>> transposed_conv((64, 32, 14, 14), (16, 32, 5, 5), {"pads": (2, 2, 2, 2)}, "cpu")
    ((32, 16, 5, 5), {'pads': (2, 2, 2, 2), 'strides': (1, 1), 'dilations': (1, 1), 'group': 1})
    >>> transposed_conv((64, 32, 14, 14), (16, 32, 3, 3), {"strides": (2, 2)}, "cpu") is None
    True
    """
    if device != "cpu":
        return None
    geo = conv_geometry(x, w, attrs)
    (kh, kw), (dh, dw), p = geo["k"], geo["d"], geo["pads"]
    if geo["s"] != (1, 1) or geo["m"] > 2 * geo["c"]:
        return None
    pads = (dh * (kh - 1) - p[0], dw * (kw - 1) - p[1], dh * (kh - 1) - p[2],
            dw * (kw - 1) - p[3])
    if min(pads) < 0:
        return None
    g = geo["group"]
    return (geo["c"], geo["m"] // g, kh, kw), \
        {"pads": pads, "strides": (1, 1), "dilations": geo["d"], "group": g}


def _grad_input_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str
                   ) -> int:
    x, w, item = outs[0].shape, ins[0].shape, ins[1].dtype.itemsize
    as_conv = transposed_conv(x, w, attrs, device)
    if as_conv is not None:
        w2, inner = as_conv
        a, b, c, _, _ = _ws_parts(ins[1].shape, w2, inner, item, "Conv", device)
        return align_up(math.prod(w2) * ins[0].dtype.itemsize) + a + b + c  # W's type
    a, b, c, _, _ = _grad_input_parts(x, w, attrs, item, device)
    return a + b + c


def _grad_input_by_conv(k: KernelArgs, w2_shape: tuple[int, ...], inner: dict[str, Any]
                        ) -> Step:
    """dX as the convolution :func:`transposed_conv` gives, by the forward's im2col
    (:func:`_im2col_tn`, the workspace after the flipped weights)."""
    xp, w, dy, dx = k.xp, k.ins[0], k.ins[1], k.outs[0]
    g, mg, cg = inner["group"], w.shape[0] // inner["group"], w.shape[1]
    w2 = k.scratch(0, w2_shape, w.dtype)
    # w2[g·C/g + c, m, i, j] = W[g·M/g + m, c, kH-1-i, kW-1-j]
    flips = [(w2[i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg, :, ::-1, ::-1].transpose(1, 0, 2, 3))
             for i in range(g)]
    conv = _im2col_tn(KernelArgs(xp=xp, ins=[dy, w2], outs=[dx],
                                 ws=k.ws[align_up(w2.nbytes):], attrs=inner,
                                 device=k.device))

    def step() -> None:
        for into, flipped in flips:
            xp.copyto(into, flipped)
        conv()

    return step


def _conv_grad_input(k: KernelArgs) -> Step:
    """As a convolution where :func:`transposed_conv` says so, else by col2im."""
    as_conv = transposed_conv(tuple(k.outs[0].shape), tuple(k.ins[0].shape), k.attrs,
                              k.device)
    if as_conv is not None:
        return _grad_input_by_conv(k, *as_conv)
    return _grad_input_col2im(k)


def _grad_input_col2im(k: KernelArgs) -> Step:
    """dcols_g = W_g^T @ dY_g, then col2im: kH·kW strided adds into the padded dX (with
    wide rows, each position's columns added as one run of the flat padded dX), chunk
    by chunk of images."""
    xp, w, dy, dx = k.xp, k.ins[0], k.ins[1], k.outs[0]
    a_bytes, b_bytes, _, geo, _ = _grad_input_parts(tuple(dx.shape), tuple(w.shape),
                                                    k.attrs, dx.dtype.itemsize, k.device)
    per = images_per_chunk("ConvGradInput", geo, dx.shape[0], dx.dtype.itemsize, k.device)
    g, m, c = geo["group"], geo["m"], geo["c"]
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    (oh, ow), (hp, wp), pads = geo["out"], geo["padded"], geo["pads"]
    wide = wide_rows("ConvGradInput", geo)
    r = row_width(geo, wide)
    wm = w.reshape(m, -1)
    mg, ckk = m // g, wm.shape[1]
    runs = []
    for lo, hi in chunks(dx.shape[0], per):
        n = hi - lo
        dxp = k.scratch(0, (n, c, hp, wp), dx.dtype)
        dcols = k.scratch(a_bytes, (c, kh, kw, n, oh, r), dx.dtype)
        dyt = k.scratch(a_bytes + b_bytes, (m, n, oh, r), dx.dtype)
        dcols_m = dcols.reshape(c * kh * kw, n * oh * r)
        dyt_m = dyt.reshape(m, n * oh * r)
        gemms = [(wm[i * mg:(i + 1) * mg].T, dyt_m[i * mg:(i + 1) * mg],
                  dcols_m[i * ckk:(i + 1) * ckk]) for i in range(g)]
        adds = []
        if wide:
            run = (oh - 1) * wp + ow
            dxp_flat = dxp.reshape(n, c, hp * wp)
            dcols_flat = dcols.reshape(c, kh, kw, n, oh * wp)
            for i in range(kh):
                for j in range(kw):
                    at = i * dh * wp + j * dw
                    adds.append((dxp_flat[:, :, at:at + run],
                                 dcols_flat[:, i, j, :, :run].transpose(1, 0, 2)))
        else:
            for i in range(kh):
                for j in range(kw):
                    r0, c0 = i * dh, j * dw
                    target = dxp[:, :, r0:r0 + sh * (oh - 1) + 1:sh,
                                 c0:c0 + sw * (ow - 1) + 1:sw]
                    adds.append((target, dcols[:, i, j].transpose(1, 0, 2, 3)))
        inner = dxp[:, :, pads[0]:pads[0] + dx.shape[2], pads[1]:pads[1] + dx.shape[3]]
        runs.append((_dy_rows(xp, dy[lo:hi], dyt, ow), gemms, dxp, adds, inner, dx[lo:hi]))

    def step() -> None:
        for copy_dy, gemms, dxp, adds, inner, dx_part in runs:
            copy_dy()
            for a, b, out in gemms:
                xp.matmul(a, b, out=out)
            dxp.fill(0)
            for target, src in adds:
                xp.add(target, src, out=target)
            xp.copyto(dx_part, inner)

    return step


def _g_conv(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    x, w = n.inputs[:2]
    attrs = dict(n.attrs)
    dx = gb.op("ConvGradInput", w, g[0], x_shape=tuple(gb.desc(x).shape), **attrs)
    dw = gb.op("ConvGradWeight", x, g[0], w_shape=tuple(gb.desc(w).shape), **attrs)
    out: list[str | None] = [dx, dw]
    if len(n.inputs) == 3:
        out.append(gb.op("ReduceSum", g[0], axes=(0, 2, 3), keepdims=0))
    return out


def _import_1d(ctx: ImportContext, path: Any, node: Any, ins: list[str],
               attrs: dict[str, Any]) -> bool:
    """A 1-D convolution as the 2-D one of a height-1 image: Unsqueeze, Conv, Squeeze
    (views, free in place)."""
    if len(ctx.shapes.get(ins[1], ())) != 3:
        return False
    x, w = (path.Unsqueeze(v, axes=(2,)) for v in ins[:2])
    two = dict(attrs)
    for key, lead in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if attrs.get(key):
            two[key] = (lead, *attrs[key])
    if attrs.get("pads"):
        two["pads"] = (0, attrs["pads"][0], 0, attrs["pads"][1])
    y = path.Conv(x, w, *ins[2:], **two)
    path.Squeeze(y, axes=(2,), outputs=list(node.output))
    return True


# Conv's forward variants by name, im2col (the default) first; the others register
# themselves from the modules of engine/ops/conv_variants/ (found when engine.ops loads).
# im2col's own inner choice (a nested selection): the layout of its GEMM, "tn" first:
# the auto-tuner chose it on every convolutional model of bench/autotune.py (the MNIST
# CNN, squeezenet, shufflenet, inception), and the MNIST CNN's training step took 8%
# less with it on two threads (its copy into Y moves whole rows of oH·oW).
IM2COL_GEMMS: dict[str, Variant] = {
    "tn": Variant(applies=lambda ins, outs, attrs: True, workspace=_im2col_ws,
                  kernel=_im2col_tn, doc="W @ columns: the product [M, N·oH·R]"),
    "nt": Variant(applies=lambda ins, outs, attrs: True, workspace=_im2col_ws,
                  kernel=_im2col_conv, doc="columns^T @ W^T: the product [N·oH·R, M]"),
}
VARIANTS: dict[str, Variant] = {
    "im2col": Variant(applies=lambda ins, outs, attrs: True, workspace=_im2col_ws,
                      kernel=_im2col_tn, inner=IM2COL_GEMMS,
                      doc="columns [C·kH·kW, N·oH·R] in the workspace, one GEMM per group"),
}

OPS = [
    OpDef(name="Conv", shape=_conv_shape, kernel=_conv, grad=_g_conv, workspace=_conv_ws,
          flops=_conv_flops,
          variants=VARIANTS,
          num_inputs=(2, 3), attrs=dict(CONV_ATTRS), stacking=NOT_STACKED,
          onnx=OnnxForm(name="Conv", build=_import_1d, needs_shapes=True,
                        engine_attrs=frozenset({"algorithm"})),
          doc="ONNX Conv, 2-D: im2col into the workspace and one GEMM per group"),
    OpDef(name="ConvGradWeight", shape=_grad_weight_shape, kernel=_conv_grad_weight,
          flops=_grad_weight_flops,
          grad=FIRST_ORDER_ONLY, workspace=_grad_weight_ws, num_inputs=(2, 2),
          attrs={**CONV_ATTRS, "w_shape": ()}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: the gradient of Conv's weights, dY @ columns^T"),
    OpDef(name="ConvGradInput", shape=_grad_input_shape, kernel=_conv_grad_input,
          flops=_grad_input_flops,
          grad=FIRST_ORDER_ONLY, workspace=_grad_input_ws, num_inputs=(2, 2),
          attrs={**CONV_ATTRS, "x_shape": ()}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: the gradient of Conv's input, a convolution of dY by the flipped "
              "kernel at stride 1, else W^T @ dY scattered back (col2im)"),
]
