"""Matrix products: ``MatMul`` (ONNX, N-D with broadcasting), ``Gemm`` (ONNX: the fused
``alpha * A' B' + beta * C``, our Linear layer) and the internal ``MatMulT``.

Transposes are never materialised: kernels bind transposed *views* once, and BLAS
reads them with its transpose flags.  Gemm has two layouts (``algorithm``, variants of
one group: a dense layer's forward and gradient products choose together): ``blas``, the
product as written, and ``transposed``, ``Y^T = B'^T A'^T`` into the workspace.
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import GraphError, ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    MADE_AFTER_STACKING,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    Variant,
    broadcast_shapes,
    matmul_flops,
    need_float,
    pick_variant,
    same_dtype,
)
from engine.ops._onnx import OnnxForm
from engine.ops.elementwise import unbroadcast
from engine.ops.strided_gemm import matmul_step


def _mm_shape(a: tuple[int, ...], b: tuple[int, ...], ta: bool, tb: bool) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matrix product needs rank >= 2 operands, got {a} and {b}")
    m, ka = (a[-1], a[-2]) if ta else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    if ka != kb:
        raise ShapeError(f"inner dimensions differ: {a} x {b} ({ka} vs {kb})")
    lead = broadcast_shapes(a[:-2], b[:-2])
    return (*lead, m, n)


def _folded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with every axis but the last merged into one (``fold``)."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return (rows, shape[-1])


def _matmul_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    a, b = ins[0].shape, ins[1].shape
    if attrs.get("fold", 0):
        if len(a) < 2 or a[:-1] != b[:-1] or not (ta and not tb):
            raise ShapeError(f"a folded product takes A^T B of operands that share every "
                             f"axis but the last, got {a} and {b}")
        return [TensorDesc(dt, _mm_shape(_folded(a), _folded(b), True, False))]
    if not (ta or tb) and (len(a) == 1 or len(b) == 1):  # numpy's 1-D promotion
        if len(a) == 1 and len(b) == 1:
            if a != b:
                raise ShapeError(f"inner dimensions differ: {a} x {b}")
            return [TensorDesc(dt, ())]
        out = _mm_shape((1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b,
                        False, False)
        out = out[:-2] + out[-1:] if len(a) == 1 else out[:-1]
        return [TensorDesc(dt, out)]
    return [TensorDesc(dt, _mm_shape(a, b, ta, tb))]


def _matmul_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """2·K per element of the product, broadcast batches included (folded: K is every
    row of the operands)."""
    if attrs.get("fold", 0):
        return 2 * _folded(ins[0].shape)[0] * outs[0].numel()
    return matmul_flops(ins[0], outs[0], bool(attrs.get("transA", 0)))


def gemm_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The product's 2·M·N·K, 1 per output element for ``alpha`` other than 1 and for the
    added C, and 1 per element of C for ``beta`` other than 1."""
    n = matmul_flops(ins[0], outs[0], bool(attrs["transA"]))
    if float(attrs["alpha"]) != 1.0:
        n += outs[0].numel()
    if len(ins) == 3:
        n += outs[0].numel()
        if float(attrs["beta"]) != 1.0:
            n += ins[2].numel()
    return n


def _t(xp: Any, x: Any, flag: Any) -> Any:
    return xp.swapaxes(x, -1, -2) if flag else x


def _matmul(k: KernelArgs) -> Step:
    xp = k.xp
    a, b, y = k.ins[0], k.ins[1], k.outs[0]
    if k.attrs.get("fold", 0):  # A^T B over every row of both: one GEMM
        a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        return matmul_step(xp, a.T, b, y)
    ta = k.attrs.get("transA", 0)
    if b.ndim == 2 and a.ndim > 2 and not ta and a.flags.c_contiguous and \
            y.flags.c_contiguous:
        # an N-D input by one matrix (a linear layer over a sequence): one GEMM over
        # every row, not one per leading index (numpy's matmul loops over them)
        a, y = a.reshape(-1, a.shape[-1]), y.reshape(-1, y.shape[-1])
    a = _t(xp, a, ta)
    b = _t(xp, b, k.attrs.get("transB", 0))
    # On a GPU one strided cuBLAS call where the views allow (CuPy's matmul copies a
    # transposed batched operand or a broadcast one into temporaries at every step).
    return matmul_step(xp, a, b, y)


def _g_matmul(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    a, b = n.inputs
    if min(len(gb.desc(a).shape), len(gb.desc(b).shape)) < 2:
        raise GraphError(f"the gradient of MatMul with a 1-D operand ({gb.desc(a).shape} x "
                         f"{gb.desc(b).shape}) is not supported: reshape it to 2-D")
    if len(gb.desc(a).shape) == 2 and len(gb.desc(b).shape) == 2:
        return [gb.op("Gemm", g[0], b, transB=1), gb.op("Gemm", a, g[0], transA=1)]
    da = gb.op("MatMulT", g[0], b, transB=1)
    if len(gb.desc(b).shape) == 2:  # one matrix for every row of A: one folded GEMM
        return [unbroadcast(gb, da, a), gb.op("MatMulT", a, g[0], transA=1, fold=1)]
    db = gb.op("MatMulT", a, g[0], transA=1)
    return [unbroadcast(gb, da, a), unbroadcast(gb, db, b)]


def _g_matmul_t(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    if n.attrs.get("fold", 0):
        raise GraphError("the gradient of a folded MatMulT (itself a gradient) is not "
                         "supported")
    a, b = n.inputs
    ta, tb = int(n.attrs.get("transA", 0)), int(n.attrs.get("transB", 0))
    # Y = A' B'.  dA' = dY B'^T, dB' = A'^T dY; transpose back where A or B was transposed.
    da = (gb.op("MatMulT", b, g[0], transA=tb, transB=1) if ta
          else gb.op("MatMulT", g[0], b, transB=1 - tb))
    if len(gb.desc(b).shape) == 2 and len(gb.desc(a).shape) > 2 and not ta:
        # a matrix applied to every row of an N-D A (a linear layer over a sequence):
        # its gradient sums over all those rows, one folded GEMM, rather than a product
        # per leading index summed afterwards
        db = (gb.op("MatMulT", g[0], a, transA=1, fold=1) if tb
              else gb.op("MatMulT", a, g[0], transA=1, fold=1))
        return [unbroadcast(gb, da, a), db]
    db = (gb.op("MatMulT", g[0], a, transA=1, transB=ta) if tb
          else gb.op("MatMulT", a, g[0], transA=1 - ta))
    return [unbroadcast(gb, da, a), unbroadcast(gb, db, b)]


def _export_matmul_t(n: Any, helper: Any, nh: Any) -> tuple[list[Any], list[Any]]:
    """MatMulT as ONNX's MatMul, a transposed operand first transposed (its last two
    axes, at its rank: ``input_shapes``, which the exporter adds)."""
    if n.attrs.get("fold", 0):
        raise GraphError("a folded MatMulT (a weight gradient) has no ONNX form")
    names = []
    nodes = []
    for i, (x, flag) in enumerate(zip(n.inputs, ("transA", "transB"), strict=True)):
        if not n.attrs.get(flag, 0):
            names.append(x)
            continue
        rank = len(n.attrs["input_shapes"][i])
        perm = [*range(rank - 2), rank - 1, rank - 2]
        names.append(f"{n.outputs[0]}_{'ab'[i]}t")
        nodes.append(helper.make_node("Transpose", [x], [names[-1]], perm=perm))
    return [*nodes, helper.make_node("MatMul", names, list(n.outputs))], []


def _gemm_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    if len(ins[0].shape) != 2 or len(ins[1].shape) != 2:
        raise ShapeError(f"Gemm needs 2-D A and B, got {ins[0].shape} and {ins[1].shape}")
    y = _mm_shape(ins[0].shape, ins[1].shape, bool(attrs["transA"]), bool(attrs["transB"]))
    if len(ins) == 3:
        c = ins[2].shape
        if broadcast_shapes(c, y) != y:
            raise ShapeError(f"Gemm: C {c} does not broadcast to the output {y}")
    return [TensorDesc(dt, y)]


def _gemm_blas(k: KernelArgs) -> Step:
    xp = k.xp
    a = _t(xp, k.ins[0], k.attrs["transA"])
    b = _t(xp, k.ins[1], k.attrs["transB"])
    y = k.outs[0]
    alpha, beta = float(k.attrs["alpha"]), float(k.attrs["beta"])
    c = k.ins[2] if len(k.ins) == 3 else None
    if c is None:
        if alpha == 1.0:
            return lambda: xp.matmul(a, b, out=y)

        def scaled() -> None:
            xp.matmul(a, b, out=y)
            xp.multiply(y, alpha, out=y)

        return scaled
    cb = k.scratch(0, c.shape, c.dtype) if beta != 1.0 else c

    def step() -> None:
        xp.matmul(a, b, out=y)
        if alpha != 1.0:
            xp.multiply(y, alpha, out=y)
        if beta != 1.0:
            xp.multiply(c, beta, out=cb)
        xp.add(y, cb, out=y)

    return step


def _blas_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ins[2].nbytes() if len(ins) == 3 and float(attrs["beta"]) != 1.0 else 0


def _gemm_transposed(k: KernelArgs) -> Step:
    """Y^T = B'^T A'^T into the workspace, then Y (scaled by alpha) through a transposed
    view: BLAS sees the product with M and N swapped, and packs its operands the other
    way round."""
    xp = k.xp
    a = _t(xp, k.ins[0], k.attrs["transA"])
    b = _t(xp, k.ins[1], k.attrs["transB"])
    y = k.outs[0]
    alpha, beta = float(k.attrs["alpha"]), float(k.attrs["beta"])
    yt = k.scratch(0, (y.shape[1], y.shape[0]), y.dtype)
    at, bt, ytt = a.T, b.T, yt.T
    c = k.ins[2] if len(k.ins) == 3 else None
    cb = k.scratch(align_up(yt.nbytes), c.shape, c.dtype) if c is not None and beta != 1.0 \
        else c

    def step() -> None:
        xp.matmul(bt, at, out=yt)
        if alpha != 1.0:
            xp.multiply(ytt, alpha, out=y)
        else:
            xp.copyto(y, ytt)
        if c is not None:
            if beta != 1.0:
                xp.multiply(c, beta, out=cb)
            xp.add(y, cb, out=y)

    return step


def _transposed_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                   device: str) -> int:
    return align_up(outs[0].nbytes()) + _blas_ws(ins, outs, attrs, device)


def _always(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return True


DENSE_LAYOUT = "dense layout"  # a dense layer's products choose their layout together

GEMM_VARIANTS: dict[str, Variant] = {
    "blas": Variant(applies=_always, workspace=_blas_ws, kernel=_gemm_blas, group=DENSE_LAYOUT,
                    doc="Y = A' @ B': BLAS reads transposed operands through its flags"),
    "transposed": Variant(applies=_always, workspace=_transposed_ws, kernel=_gemm_transposed,
                          group=DENSE_LAYOUT,
                          doc="Y^T = B'^T @ A'^T into the workspace, copied into Y"),
}


def _gemm(k: KernelArgs) -> Step:
    return pick_variant("Gemm", GEMM_VARIANTS, k.attrs).kernel(k)


def _gemm_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return pick_variant("Gemm", GEMM_VARIANTS, attrs).workspace(ins, outs, attrs, device)


def _g_gemm(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    a, b = n.inputs[:2]
    ta, tb = int(n.attrs["transA"]), int(n.attrs["transB"])
    alpha, beta = float(n.attrs["alpha"]), float(n.attrs["beta"])
    dy = g[0]
    # Y = alpha A' B' (+ beta C) with A' = A^T if transA, B' = B^T if transB.
    if ta:
        da = gb.op("Gemm", b, dy, transA=tb, transB=1, alpha=alpha)
    else:
        da = gb.op("Gemm", dy, b, transB=1 - tb, alpha=alpha)
    if tb:
        db = gb.op("Gemm", dy, a, transA=1, transB=ta, alpha=alpha)
    else:
        db = gb.op("Gemm", a, dy, transA=1 - ta, alpha=alpha)
    out: list[str | None] = [da, db]
    if len(n.inputs) == 3:
        out.append(gemm_bias_grad(gb, dy, beta, n.inputs[2]))
    return out


def gemm_bias_grad(gb: GradBuilder, dy: str, beta: float, c: str) -> str:
    """The gradient of a Gemm's ``beta * C`` term: ``beta * dY`` summed to C's shape."""
    dc = dy if beta == 1.0 else gb.op("Mul", dy, gb.const(beta, like=dy))
    return unbroadcast(gb, dc, c)


GEMM_ATTRS = {"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0}

OPS = [
    OpDef(name="MatMul", shape=_matmul_shape, kernel=_matmul, grad=_g_matmul, num_inputs=(2, 2),
          flops=_matmul_flops,
          stacking=StackRule.DENSE, onnx=OnnxForm(name="MatMul"),
          doc="matrix product, numpy semantics for rank >= 2"),
    OpDef(name="MatMulT", shape=_matmul_shape, kernel=_matmul, grad=_g_matmul_t, num_inputs=(2, 2),
          flops=_matmul_flops,
          attrs={"transA": 0, "transB": 0, "fold": 0}, stacking=MADE_AFTER_STACKING,
          onnx=OnnxForm(name="MatMul", export=_export_matmul_t, imports=False,
                        needs_shapes=True),
          doc="internal: MatMul with transposed operands (gradients of N-D MatMul); fold=1: "
              "A^T B over every row of two operands alike but for their last axis"),
    OpDef(name="Gemm", shape=_gemm_shape, kernel=_gemm, grad=_g_gemm, workspace=_gemm_ws,
          flops=gemm_flops,
          num_inputs=(2, 3), attrs=dict(GEMM_ATTRS), stacking=StackRule.DENSE,
          variants=GEMM_VARIANTS,
          onnx=OnnxForm(name="Gemm", engine_attrs=frozenset({"algorithm"})),
          doc="alpha * A' @ B' + beta * C: a fully connected layer (matmul + bias fused)"),
]
