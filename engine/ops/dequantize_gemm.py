"""``DequantizeGemm``: a Linear layer that reads integer data, dequantizing it block by
block (what the ``fuse_dequantize`` pass makes of ``DequantizeLinear`` feeding a Gemm).

A data set of 8-bit pixels enters a model as ``DequantizeLinear(x)``; unfused, the
float copy of ``x`` is a buffer of the whole batch (31 MB for the 10,000 MNIST
validation images) that is written once and read once by the first layer's GEMM, and
at that size it leaves the cache in between: validating in one chunk ran slower than
in chunks of 512.  Fused, the rows are converted a block at a time into a workspace
that stays in the cache (``BLOCK_BYTES``), each block is multiplied at once, and the
float copy never exists: the heap shrinks by it, and the layer runs at the speed of
the GEMM alone.

The scale (and ``alpha``) are applied to the product rather than to the converted
rows: ``(x - z) s @ B = s ((x - z) @ B)``, one pass over the ``N`` output columns
instead of the ``K`` input ones, and bit for bit the same when ``s`` is a power of
two, as the pixel scales are.

The gradient reaches ``B`` and ``C`` only (the data is integer), through
``DequantizeGemmGradB``, which accumulates ``dequant(x)^T dY`` over the same blocks.

>>> import numpy as np
>>> from engine import CalcGraph, Mode, VM, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 3), dtype="uint8")
>>> w = g.constant([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], shape=(3, 2), name="w")
>>> y = g.path("infer", Mode.FORWARD_ONLY).DequantizeGemm(x, w, scale=0.5, block_rows=1)
>>> vm = VM(compile_graph(g, batch_size=2, keep=[y.name]))
>>> vm.set("x", np.array([[2, 4, 6], [0, 0, 8]], dtype=np.uint8)); vm.forward("infer")
>>> vm.get(y.name).tolist()
[[4.0, 5.0], [4.0, 4.0]]
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import DType, TensorDesc
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    broadcast_shapes,
    matmul_flops,
    need_float,
)
from engine.ops._onnx import ENGINE_INTERNAL
from engine.ops.elementwise import ACTIVATION_DEFAULTS, ACTIVATION_KERNELS
from engine.ops.linalg import gemm_bias_grad

BLOCK_BYTES = 1 << 20
"""Bytes of converted rows per block: a block and its GEMM's panels stay in a core's
L2 cache (measured on 784 features: 128 to 512 rows per block ran alike, 1.7x
faster than converting all 10,000 rows first; 64 rows per block were slower)."""

INTEGER_DATA = (DType.UINT8, DType.INT8, DType.INT32)
QUANT_ATTRS = {"scale": None, "zero_point": 0, "alpha": 1.0, "block_rows": 0}


def block_rows(rows: int, features: int, itemsize: int, attrs: dict[str, Any]) -> int:
    """Rows converted per block: ``attrs["block_rows"]``, or what fits ``BLOCK_BYTES``."""
    want = int(attrs.get("block_rows") or 0) or max(1, BLOCK_BYTES // max(features * itemsize, 1))
    return max(1, min(rows, want))


def _check_quant(a: TensorDesc, attrs: dict[str, Any], op: str) -> None:
    if a.dtype not in INTEGER_DATA:
        raise ShapeError(f"{op}: A must be integer data (uint8, int8 or int32), got "
                         f"{a.dtype.value}")
    if len(a.shape) != 2:
        raise ShapeError(f"{op}: A must be 2-D, got {a.shape}")
    if not isinstance(attrs["scale"], int | float) or isinstance(attrs["scale"], bool):
        raise ShapeError(f"{op}: scale must be one number, got {attrs['scale']!r}")
    if not isinstance(attrs["zero_point"], int) or isinstance(attrs["zero_point"], bool):
        raise ShapeError(f"{op}: zero_point must be one integer, got {attrs['zero_point']!r}")


def _shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    a, b = ins[0], ins[1]
    _check_quant(a, attrs, "DequantizeGemm")
    need_float(b, "B")
    if len(b.shape) != 2:
        raise ShapeError(f"DequantizeGemm: B must be 2-D, got {b.shape}")
    k, n = (b.shape[1], b.shape[0]) if attrs["transB"] else b.shape
    if a.shape[1] != k:
        raise ShapeError(f"DequantizeGemm: inner dimensions differ: {a.shape} x {b.shape}"
                         f"{' (B transposed)' if attrs['transB'] else ''}")
    y = (a.shape[0], n)
    if len(ins) == 3:
        if ins[2].dtype != b.dtype:
            raise ShapeError(f"DequantizeGemm: C is {ins[2].dtype.value}, B {b.dtype.value}")
        if broadcast_shapes(ins[2].shape, y) != y:
            raise ShapeError(f"DequantizeGemm: C {ins[2].shape} does not broadcast to the "
                             f"output {y}")
    act = attrs["activation"]
    if act is not None and act not in ACTIVATION_KERNELS:
        raise ShapeError(f"DequantizeGemm: activation {act!r} is not one of "
                         f"{', '.join(sorted(ACTIVATION_KERNELS))} (or none)")
    return [TensorDesc(b.dtype, y)]


def _workspace(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    rows, k = ins[0].shape
    item = outs[0].dtype.itemsize
    scaled_c = ins[2].nbytes() if len(ins) == 3 and float(attrs["beta"]) != 1.0 else 0
    return align_up(block_rows(rows, k, item, attrs) * k * item) + scaled_c


def _flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """What the unfused DequantizeLinear and Gemm (and activation) count: 2 per element
    of A, the product's 2·M·N·K, then 1 per output element each for ``alpha`` other
    than 1, the added C and the activation, and 1 per element of C for ``beta`` other
    than 1.  The scale applied to the product instead of A changes nothing: MFU
    counts the model's arithmetic."""
    y = outs[0].numel()
    n = 2 * ins[0].numel() + matmul_flops(ins[0], outs[0])
    n += y * (float(attrs["alpha"]) != 1.0) + y * (attrs["activation"] is not None)
    if len(ins) == 3:
        n += y + ins[2].numel() * (float(attrs["beta"]) != 1.0)
    return n


def _grad_b_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The unfused Gemm's ``A^T dY``: 2·rows per element of dB, and 1 per element for
    ``alpha`` other than 1 (the conversion of A is the forward's, not counted again)."""
    a, db = ins[0], outs[0]
    return 2 * a.shape[0] * db.numel() + db.numel() * (float(attrs["alpha"]) != 1.0)


def _converter(xp: Any, zero: int) -> Any:
    """``dst[...] = src - zero`` as floats, without a cast buffer (see engine.ops.cast)."""
    def convert(dst: Any, src: Any) -> None:
        xp.copyto(dst, src, casting="unsafe")
        if zero:
            xp.subtract(dst, zero, out=dst)

    return convert


def _kernel(k: KernelArgs) -> Step:
    xp, a, y = k.xp, k.ins[0], k.outs[0]
    b = xp.swapaxes(k.ins[1], 0, 1) if k.attrs["transB"] else k.ins[1]
    rows, feats = a.shape
    block = block_rows(rows, feats, y.dtype.itemsize, k.attrs)
    scratch = k.scratch(0, (block, feats), y.dtype)
    coef = float(k.attrs["alpha"]) * float(k.attrs["scale"])
    beta = float(k.attrs["beta"])
    c = k.ins[2] if len(k.ins) == 3 else None
    cb = c
    if c is not None and beta != 1.0:
        cb = k.scratch(align_up(block * feats * y.dtype.itemsize), c.shape, c.dtype)
    convert = _converter(xp, int(k.attrs["zero_point"]))
    act_kernel = ACTIVATION_DEFAULTS.get(k.attrs["activation"] or "")
    blocks = []
    for s in range(0, rows, block):
        n = min(block, rows - s)
        yb = y[s:s + n]
        act = act_kernel(KernelArgs(xp, [yb], [yb], k.ws, {}, k.rng, k.device)) \
            if act_kernel else None
        blocks.append((a[s:s + n], scratch[:n], yb, act))

    def step() -> None:
        if cb is not c:
            xp.multiply(c, beta, out=cb)
        for ab, sb, yb, act in blocks:
            convert(sb, ab)
            xp.matmul(sb, b, out=yb)
            if coef != 1.0:
                xp.multiply(yb, coef, out=yb)
            if cb is not None:
                xp.add(yb, cb, out=yb)
            if act is not None:
                act()

    return step


def _grad(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    act = n.attrs["activation"]
    dz = gb.op(f"{act}Grad", n.outputs[0], g[0]) if act else g[0]
    quant = {key: n.attrs[key] for key in QUANT_ATTRS}
    out: list[str | None] = [None, gb.op("DequantizeGemmGradB", n.inputs[0], dz,
                                         transB=n.attrs["transB"], **quant)]
    if len(n.inputs) == 3:
        out.append(gemm_bias_grad(gb, dz, float(n.attrs["beta"]), n.inputs[2]))
    return out


def _grad_b_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    a, dy = ins
    _check_quant(a, attrs, "DequantizeGemmGradB")
    need_float(dy, "dY")
    if len(dy.shape) != 2 or dy.shape[0] != a.shape[0]:
        raise ShapeError(f"DequantizeGemmGradB: dY {dy.shape} does not match A {a.shape}")
    k, n = a.shape[1], dy.shape[1]
    return [TensorDesc(dy.dtype, (n, k) if attrs["transB"] else (k, n))]


def _grad_b_workspace(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                      device: str) -> int:
    rows, k = ins[0].shape
    item = outs[0].dtype.itemsize
    block = block_rows(rows, k, item, attrs)
    partial = outs[0].nbytes() if rows > block else 0  # a later block's share, summed in
    return align_up(block * k * item) + partial


def _grad_b_kernel(k: KernelArgs) -> Step:
    """``dB = alpha scale (x - z)^T dY`` (transposed when B is), summed over row blocks."""
    xp, a, dy, db = k.xp, k.ins[0], k.ins[1], k.outs[0]
    rows, feats = a.shape
    block = block_rows(rows, feats, db.dtype.itemsize, k.attrs)
    scratch = k.scratch(0, (block, feats), db.dtype)
    offset = align_up(block * feats * db.dtype.itemsize)
    partial = k.scratch(offset, db.shape, db.dtype) if rows > block else None
    coef = float(k.attrs["alpha"]) * float(k.attrs["scale"])
    trans = bool(k.attrs["transB"])
    convert = _converter(xp, int(k.attrs["zero_point"]))
    blocks = []
    for i, s in enumerate(range(0, rows, block)):
        n = min(block, rows - s)
        sb, gy = scratch[:n], dy[s:s + n]
        lhs, rhs = (gy.T, sb) if trans else (sb.T, gy)
        blocks.append((a[s:s + n], sb, lhs, rhs, db if i == 0 else partial))

    def step() -> None:  # rows >= 1: a batch is never empty
        for ab, sb, lhs, rhs, target in blocks:
            convert(sb, ab)
            xp.matmul(lhs, rhs, out=target)
            if target is not db:
                xp.add(db, target, out=db)
        if coef != 1.0:
            xp.multiply(db, coef, out=db)

    return step


OPS = [
    OpDef(name="DequantizeGemm", shape=_shape, kernel=_kernel, grad=_grad, workspace=_workspace,
          flops=_flops,
          num_inputs=(2, 3), attrs={"transB": 0, "beta": 1.0, "activation": None, **QUANT_ATTRS},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="activation(alpha * ((A - zero_point) * scale) @ B' + beta * C) for integer "
              "A, converted a block of rows at a time (DequantizeLinear fused into Gemm)"),
    OpDef(name="DequantizeGemmGradB", shape=_grad_b_shape, kernel=_grad_b_kernel,
          flops=_grad_b_flops,
          grad=FIRST_ORDER_ONLY, workspace=_grad_b_workspace, num_inputs=(2, 2),
          attrs={"transB": 0, **QUANT_ATTRS}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: the gradient of DequantizeGemm with respect to B"),
]
