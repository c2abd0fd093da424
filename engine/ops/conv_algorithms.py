"""The kernels of Conv's other forward variants (registered in
:mod:`engine.ops.conv_variants`, chosen by the ``algorithm`` attribute; ``im2col`` is the
default, in :mod:`engine.ops.conv`).  Each has
its own workspace rule, so the compiler sizes whichever is chosen exactly, and a tuner
can weigh bytes against time:

- ``direct``: one GEMM per kernel position, ``X_k [N·oH·oW, C] @ W_k [C, M]`` summed
  into the output, where ``X_k`` is the (strided) input the position reads.  Its
  workspace is one position's input, not all ``kH·kW`` of them: im2col's columns are
  ``kH·kW`` times bigger.
- ``winograd``: F(2x2, 3x3) for 3x3 kernels at stride and dilation 1 (Lavin & Gray,
  2016): input tiles of 4x4 and the kernels are transformed, multiplied as 16 GEMMs
  (one batched call) and transformed back, 2x2 outputs at a time: 16 multiplications
  per 4 outputs where a direct 3x3 needs 36.

All give the same results within float32 rounding (tests/test_conv_algorithms.py).

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph(); x = g.placeholder("x", (1, 1, 4, 4)); w = g.placeholder("w", (1, 1, 3, 3))
>>> p = g.path("c", Mode.FORWARD_ONLY)
>>> from engine.ops import get_op
>>> ys = [p.Conv(x, w, pads=(1, 1, 1, 1), algorithm=a) for a in get_op("Conv").variants]
>>> vm = VM(compile_graph(g, batch_size=1, keep=[y.name for y in ys]))
>>> vm.set("x", np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
>>> vm.set("w", np.ones((1, 1, 3, 3), np.float32)); vm.forward("c")
>>> [float(vm.get(y.name)[0, 0, 1, 1]) for y in ys]
[45.0, 45.0, 45.0]
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.ops._base import KernelArgs, Step


def _padded_bytes(x: tuple[int, ...], hp: int, wp: int, item: int) -> int:
    return align_up(x[0] * x[1] * hp * wp * item)


# -- direct -------------------------------------------------------------------------------


def direct_ws(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    n, c = x[0], x[1]
    (oh, ow), m = geo["out"], geo["m"]
    hp, wp = geo["padded"]
    padded = _padded_bytes(x, hp, wp, item) if any(geo["pads"]) else 0
    return padded + align_up(n * oh * ow * c * item) + 2 * align_up(n * oh * ow * m * item) + \
        align_up(geo["k"][0] * geo["k"][1] * c * m * item)


def direct(k: KernelArgs, geo: dict[str, Any], pad: Step | None, padded: Any, at: int) -> Step:
    """``pad``, ``padded``: conv's padded copy of the input (which used ``at`` bytes)."""
    xp, x, w, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    b = k.ins[2] if len(k.ins) == 3 else None
    n, c = x.shape[0], x.shape[1]
    g, m, (oh, ow) = geo["group"], geo["m"], geo["out"]
    (kh, kw), (sh, sw), (dh, dw) = geo["k"], geo["s"], geo["d"]
    rows, cg, mg = n * oh * ow, c // g, m // g
    xk = k.scratch(at, (n, oh, ow, c), x.dtype)
    at += align_up(rows * c * x.dtype.itemsize)
    acc = k.scratch(at, (rows, m), x.dtype)
    at += align_up(rows * m * x.dtype.itemsize)
    part = k.scratch(at, (rows, m), x.dtype)
    at += align_up(rows * m * x.dtype.itemsize)
    # W_k as [kH·kW, C/g, M] (a group's block of rows is its own C/g), contiguous
    wt = k.scratch(at, (kh * kw, cg, m), x.dtype)
    w_t = w.reshape(m, cg, kh * kw).transpose(2, 1, 0)
    views = [padded[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                    j * dw:j * dw + sw * (ow - 1) + 1:sw].transpose(0, 2, 3, 1)
             for i in range(kh) for j in range(kw)]
    x2 = xk.reshape(rows, c)
    gemms = [[(x2[:, gi * cg:(gi + 1) * cg], wt[p, :, gi * mg:(gi + 1) * mg],
               part[:, gi * mg:(gi + 1) * mg]) for gi in range(g)] for p in range(kh * kw)]
    acc_nchw = acc.reshape(n, oh, ow, m).transpose(0, 3, 1, 2)

    def step() -> None:
        if pad is not None:
            pad()
        xp.copyto(wt, w_t)
        acc.fill(0)
        for view, per_group in zip(views, gemms, strict=True):
            xp.copyto(xk, view)
            for a, wk, out in per_group:
                xp.matmul(a, wk, out=out)
            xp.add(acc, part, out=acc)
        if b is not None:
            xp.add(acc, b, out=acc)
        xp.copyto(y, acc_nchw)

    return step


# -- Winograd F(2x2, 3x3) -------------------------------------------------------------------


def _tiles(geo: dict[str, Any]) -> tuple[int, int]:
    oh, ow = geo["out"]
    return -(-oh // 2), -(-ow // 2)


def winograd_ws(x: tuple[int, ...], geo: dict[str, Any], item: int) -> int:
    n, c, m = x[0], x[1], geo["m"]
    th, tw = _tiles(geo)
    t = n * th * tw
    return (_padded_bytes(x, 2 * th + 2, 2 * tw + 2, item) + 2 * align_up(16 * c * t * item)
            + align_up(16 * m * c * item) + align_up(12 * m * c * item)
            + align_up(16 * m * t * item) + align_up(8 * m * t * item)
            + align_up(n * m * 2 * th * 2 * tw * item))


def winograd(k: KernelArgs, geo: dict[str, Any]) -> Step:
    xp, x, w, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    b = k.ins[2] if len(k.ins) == 3 else None
    n, c, m = x.shape[0], x.shape[1], geo["m"]
    th, tw = _tiles(geo)
    t = n * th * tw
    item = x.dtype.itemsize
    top, left = geo["pads"][0], geo["pads"][1]
    hp, wp = 2 * th + 2, 2 * tw + 2  # room for every 4x4 tile (zeros past the pads)
    offset = [0]

    def take(shape: tuple[int, ...], nbytes: int) -> Any:
        view = k.scratch(offset[0], shape, x.dtype)
        offset[0] += align_up(nbytes)
        return view

    xpad = take((n, c, hp, wp), n * c * hp * wp * item)
    inner = xpad[:, :, top:top + x.shape[2], left:left + x.shape[3]]
    tmp = take((4, 4, n, c, th, tw), 16 * c * t * item)  # B^T d, row by row
    v = take((4, 4, c, n, th, tw), 16 * c * t * item)  # B^T d B, laid out for the GEMMs
    u = take((4, 4, m, c), 16 * m * c * item)  # G g G^T
    gg = take((4, 3, m, c), 12 * m * c * item)  # G g
    prod = take((4, 4, m, n, th, tw), 16 * m * t * item)
    s = take((2, 4, m, n, th, tw), 8 * m * t * item)  # A^T M, row by row
    out = take((n, m, 2 * th, 2 * tw), n * m * 4 * th * tw * item)
    d = [[xpad[:, :, r:r + 2 * th - 1:2, q:q + 2 * tw - 1:2] for q in range(4)] for r in range(4)]
    vt = [[v[r, q].transpose(1, 0, 2, 3) for q in range(4)] for r in range(4)]  # [n, c, ...]
    wk = [[w[:, :, r, q] for q in range(3)] for r in range(3)]  # [m, c]
    ym = [[out[:, :, a::2, q::2] for q in range(2)] for a in range(2)]
    sm = [[s[a, q].transpose(1, 0, 2, 3) for q in range(4)] for a in range(2)]  # [n, m, ...]
    u_m = u.reshape(16, m, c)
    v_m = v.reshape(16, c, t)
    p_m = prod.reshape(16, m, t)
    pm = [[prod[r, q] for q in range(4)] for r in range(4)]  # [m, n, th, tw]
    bias = b.reshape(1, m, 1, 1) if b is not None else None

    def bt(rows: list[Any], into: list[Any]) -> None:
        """B^T applied to four rows: (r0 - r2, r1 + r2, r2 - r1, r1 - r3)."""
        xp.subtract(rows[0], rows[2], out=into[0])
        xp.add(rows[1], rows[2], out=into[1])
        xp.subtract(rows[2], rows[1], out=into[2])
        xp.subtract(rows[1], rows[3], out=into[3])

    def g3(rows: list[Any], into: list[Any]) -> None:
        """G applied to three rows: (r0, (r0 + r1 + r2) / 2, (r0 - r1 + r2) / 2, r2)."""
        xp.copyto(into[0], rows[0])
        xp.add(rows[0], rows[2], out=into[1])
        xp.subtract(into[1], rows[1], out=into[2])
        xp.add(into[1], rows[1], out=into[1])
        xp.multiply(into[1], 0.5, out=into[1])
        xp.multiply(into[2], 0.5, out=into[2])
        xp.copyto(into[3], rows[2])

    def at2(rows: list[Any], into: list[Any]) -> None:
        """A^T applied to four rows: (r0 + r1 + r2, r1 - r2 - r3)."""
        xp.add(rows[0], rows[1], out=into[0])
        xp.add(into[0], rows[2], out=into[0])
        xp.subtract(rows[1], rows[2], out=into[1])
        xp.subtract(into[1], rows[3], out=into[1])

    def step() -> None:
        xpad.fill(0)
        xp.copyto(inner, x)
        for q in range(4):  # columns of each tile: B^T d
            bt([d[r][q] for r in range(4)], [tmp[r, q] for r in range(4)])
        for r in range(4):  # then rows: (B^T d) B
            bt([tmp[r, q] for q in range(4)], vt[r])
        for q in range(3):  # G g
            g3([wk[r][q] for r in range(3)], [gg[r, q] for r in range(4)])
        for r in range(4):  # (G g) G^T
            g3([gg[r, q] for q in range(3)], [u[r, q] for q in range(4)])
        xp.matmul(u_m, v_m, out=p_m)  # 16 GEMMs [M, C] @ [C, N·tiles] in one call
        for q in range(4):  # A^T M
            at2([pm[r][q] for r in range(4)], [s[a, q] for a in range(2)])
        for a in range(2):  # (A^T M) A, into each tile's 2x2 outputs
            at2(sm[a], ym[a])
        xp.copyto(y, out[:, :, :y.shape[2], :y.shape[3]])
        if bias is not None:
            xp.add(y, bias, out=y)

    return step
