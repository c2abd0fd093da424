"""Losses, metrics and dropout.

- ``SoftmaxCrossEntropyLoss`` (ONNX): ``scores [b, C]``, ``labels [b]`` (int64) ->
  scalar loss, plus ``log_prob [b, C]`` which the gradient reads.
- ``MSELoss``: mean squared error; ``MAELoss``: mean absolute error; ``HuberLoss``:
  torch's ``HuberLoss(reduction="mean")`` (none of them ONNX ops).
- ``Accuracy`` and ``RMSE``: metrics, for FORWARD_ONLY post-processing paths.
- ``Dropout`` (ONNX): training draws a mask (kept as a second output for the backward
  pass); in a FORWARD_ONLY path, or with ``training=0``, it is the identity.

The labelled entries are reached through flat indices ``i * C + label`` built in the
workspace and ``take``/``put`` with ``mode="clip"`` (labels are range-checked first):
fancy indexing or a broadcast comparison would allocate in a step.  The common
2-D cross-entropy and its gradient also have a compiled variant (``"numba"``,
:mod:`engine.ops.jit`) that walks the rows once: numpy's reductions over ten classes
per row cost more than the arithmetic.
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import InputError, ShapeError
from engine.graph import DType, Node, TensorDesc
from engine.ops import jit, nll
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    NON_DIFFERENTIABLE_METRIC,
    NOT_STACKED,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    StackRule,
    Step,
    is_numpy,
    need_float,
    per_input,
    per_output,
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL, NOT_IN_ONNX, Exported, ImportContext, OnnxForm
from engine.ops.reduce import log_softmax_step


def check_labels(labels: TensorDesc, shape: tuple[int, ...], scores: tuple[int, ...],
                 op: str) -> None:
    """Integer labels of ``shape`` (the scores' batch dimension)."""
    if labels.dtype not in (DType.INT64, DType.INT32):
        raise ShapeError(f"{op}: labels must be int64 or int32, got {labels.dtype.value}")
    if labels.shape != shape:
        raise ShapeError(f"{op}: labels {labels.shape} do not match scores {scores}")


def _check_scores_labels(scores: TensorDesc, labels: TensorDesc, op: str) -> None:
    need_float(scores, f"{op} scores")
    if len(scores.shape) != 2:
        raise ShapeError(f"{op}: scores must be [batch, classes], got {scores.shape}")
    check_labels(labels, scores.shape[:1], scores.shape, op)


def fast(rank: int, n_inputs: int, attrs: dict[str, Any]) -> bool:
    """The common case, with kernels of its own: 2-D scores, no class weights, nothing
    ignored, a reduced loss (the general ones are in :mod:`engine.ops.nll`)."""
    return rank == 2 and n_inputs == 2 and attrs.get("ignore_index") is None and \
        attrs["reduction"] in ("mean", "sum")


def _sce_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if fast(len(ins[0].shape), len(ins), attrs):
        _check_scores_labels(ins[0], ins[1], "SoftmaxCrossEntropyLoss")
        return [TensorDesc(ins[0].dtype, ()), ins[0]]
    return [nll.check(ins, attrs, "SoftmaxCrossEntropyLoss"), ins[0]]


def take_rows(xp: Any, flat: Any, idx: Any, out: Any) -> None:
    """out = flat[idx] without allocating: numpy needs mode="clip" (its default mode
    buffers ``out``); cupy's take has no mode and does not buffer."""
    if is_numpy(xp):
        xp.take(flat, idx, out=out, mode="clip")
    else:
        xp.take(flat, idx, out=out)


def labels_out_of_range(labels: Any, classes: int) -> InputError:
    """The error for labels outside [0, ``classes``), naming the range they span."""
    lo, hi = int(labels.min()), int(labels.max())
    return InputError(f"labels must lie in [0, {classes}); got values in [{lo}, {hi}]")


def row_index_step(xp: Any, idx: Any, labels: Any, classes: int, check: bool = True) -> Step:
    """idx[i] = i * C + labels[i]: flat positions of the labelled classes.  Built with
    same-shape calls (no fancy indexing), which allocate nothing.  A 2-D ``idx``
    ``[b, K]`` (a stack of K models) gets ``(i * K + k) * C + labels[i]``.
    ``check``: fail on labels outside [0, C) (the gradient skips it: its forward,
    which must run first, checked the same labels)."""

    # Seen as unsigned, a negative label is huge: one max() checks both ends.
    unsigned = labels.view(labels.dtype.str.replace("i", "u"))
    flat = idx.reshape(-1)
    lab = labels if idx.ndim == 1 else labels.reshape(-1, 1)
    if not is_numpy(xp):
        return _row_index_step_device(xp, idx, labels, classes, check)

    def step() -> None:
        if check and int(unsigned.max()) >= classes:
            raise labels_out_of_range(labels, classes)
        flat.fill(classes)
        flat[0] = 0
        xp.cumsum(flat, out=flat)  # i * C
        xp.add(idx, lab, out=idx)

    return step


_ROW_INDEX = ("raw L labels, int64 C, int64 K", "I idx",
              "idx = (I)(i * C + (long long)labels[i / K])", "calcgraph_row_index")


def _row_index_step_device(xp: Any, idx: Any, labels: Any, classes: int, check: bool
                           ) -> Step:
    """:func:`row_index_step` on a GPU: the positions in one kernel (CuPy's cumsum takes
    a block-sum array from the pool at every call), the labels checked first in
    ``idx`` before the kernel overwrites it (:func:`_label_check_device`)."""
    kernel = xp.ElementwiseKernel(*_ROW_INDEX)
    flat = idx.reshape(-1)
    per_row = 1 if idx.ndim == 1 else int(idx.shape[1])
    check_labels_step = _label_check_device(xp, labels, flat, classes) if check else None

    def step() -> None:
        if check_labels_step is not None:
            check_labels_step()
        kernel(labels, classes, per_row, flat)

    return step


def _label_check_device(xp: Any, labels: Any, scratch: Any, classes: int) -> Step:
    """Fail on labels outside [0, ``classes``), on a GPU without allocating: their largest
    value, seen as unsigned (a negative one is huge), is reduced into the first element
    of ``scratch`` (an integer buffer the caller overwrites afterwards), then read."""
    unsigned = labels.view(labels.dtype.str.replace("i", "u"))
    first = scratch.reshape(-1).view(unsigned.dtype)[0]  # a 0-d view: the reduction's out

    def step() -> None:
        xp.max(unsigned, out=first)
        if int(first) >= classes:
            raise labels_out_of_range(labels, classes)

    return step


def scale_by_seed(xp: Any, dx: Any, seed: Any, factor: float) -> Step:
    """``dx *= seed * factor``, ``seed`` the loss's gradient (a 0-d array).  On the host
    as one Python scalar (broadcasting a 0-d array operand would make numpy allocate
    an iteration buffer); on a GPU by the 0-d array itself, then the factor: reading
    ``float(seed)`` would wait for the device at every step."""
    if is_numpy(xp):
        return lambda: xp.multiply(dx, float(seed) * factor, out=dx)

    def step() -> None:
        xp.multiply(dx, seed, out=dx)
        xp.multiply(dx, factor, out=dx)

    return step


# SoftmaxCrossEntropyLossGrad on a GPU, rows contiguous: (softmax - one-hot) * seed * inv
# in one pass (the host's take, put and scale are six kernels and a wait for the seed).
_SCE_GRAD = ("T logp, raw L labels, raw T seed, int64 C, T inv", "T dx",
             "dx = (exp(logp) - (labels[i / C] == i % C ? (T)1 : (T)0)) * (seed[0] * inv)",
             "calcgraph_sce_grad")


def _sce_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    if not fast(len(ins[0].shape), len(ins), attrs):
        return nll.sce_ws(ins[0])
    rows = ins[0].shape[0]
    return (align_up(rows * ins[1].dtype.itemsize) + align_up(rows * ins[0].dtype.itemsize) * 2
            + ins[0].nbytes())  # index, picked values, row stats, exp scratch


def _sce(k: KernelArgs) -> Step:
    if not fast(k.ins[0].ndim, len(k.ins), k.attrs):
        return nll.sce_kernel(k)
    xp, (x, labels), (loss, logp) = k.xp, k.ins, k.outs
    b, c = x.shape
    idx = k.scratch(0, (b,), labels.dtype)
    o = align_up(b * labels.dtype.itemsize)
    picked = k.scratch(o, (b,), x.dtype)
    o += align_up(b * x.dtype.itemsize)
    s = k.scratch(o, (b, 1), x.dtype)
    e = k.scratch(o + align_up(b * x.dtype.itemsize), (b, c), x.dtype)
    scale = -1.0 / b if k.attrs["reduction"] == "mean" else -1.0
    if not is_numpy(xp) and x.flags.c_contiguous and logp.flags.c_contiguous:
        return _sce_device(xp, x, labels, loss, logp, idx, picked, scale)
    lsm = log_softmax_step(xp, x, logp, s, e, 1)
    make_idx = row_index_step(xp, idx, labels, c)
    flat = logp.reshape(-1)

    def step() -> None:
        lsm()
        make_idx()
        take_rows(xp, flat, idx, picked)
        xp.sum(picked, out=loss)
        xp.multiply(loss, scale, out=loss)

    return step


# SoftmaxCrossEntropyLoss on a GPU, rows contiguous: one thread per row writes the row's
# log-softmax and picks its labelled entry (the array calls take a dozen kernels).
_SCE_ROWS = ("raw T x, raw L labels, int64 C", "T picked, raw T logp",
             """
             const long long row = i * C;
             T m = x[row];
             for (long long j = 1; j < C; ++j) { const T v = x[row + j]; m = v > m ? v : m; }
             T total = 0;
             for (long long j = 0; j < C; ++j) total += exp(x[row + j] - m);
             const T shift = m + log(total);
             for (long long j = 0; j < C; ++j) logp[row + j] = x[row + j] - shift;
             picked = logp[row + labels[i]];
             """, "calcgraph_sce_rows")


def _sce_device(xp: Any, x: Any, labels: Any, loss: Any, logp: Any, idx: Any, picked: Any,
                scale: float) -> Step:
    """:data:`_SCE_ROWS`, then the loss from the picked entries.  The labels are checked
    first (a label outside the row would be read outside it), through the index
    scratch, which this path does not otherwise use."""
    rows = xp.ElementwiseKernel(*_SCE_ROWS)
    c = int(x.shape[1])
    check = _label_check_device(xp, labels, idx, c)

    def step() -> None:
        check()
        rows(x, labels, c, picked, logp)
        xp.sum(picked, out=loss)
        xp.multiply(loss, scale, out=loss)

    return step


def _sce_fused(k: KernelArgs, ks: Any) -> Step | None:
    if not fast(k.ins[0].ndim, len(k.ins), k.attrs):
        return None
    (x, labels), (loss, logp) = k.ins, k.outs
    if not (x.flags.c_contiguous and logp.flags.c_contiguous and labels.flags.c_contiguous):
        return None
    b, c = x.shape
    total, run = loss.reshape(1), ks.sce_forward
    scale = -1.0 / b if k.attrs["reduction"] == "mean" else -1.0

    def step() -> None:
        if run(x, labels, logp, total, scale):
            raise labels_out_of_range(labels, c)

    return step


def _sce_grad_fused(k: KernelArgs, ks: Any) -> Step | None:
    if not fast(k.ins[1].ndim, len(k.ins) - 1, k.attrs):
        return None
    (dloss, logp, labels), dx = k.ins, k.outs[0]
    if not (logp.flags.c_contiguous and dx.flags.c_contiguous and labels.flags.c_contiguous):
        return None
    xp, seed, run = k.xp, dloss.reshape(1), ks.sce_grad
    inv = 1.0 / logp.shape[0] if k.attrs["reduction"] == "mean" else 1.0

    def step() -> None:
        xp.exp(logp, out=dx)  # softmax, numpy's SIMD exp
        run(dx, labels, seed, inv)

    return step


def _g_sce(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    d = None
    if g[0]:
        d = gb.op("SoftmaxCrossEntropyLossGrad", g[0], n.outputs[1], *n.inputs[1:],
                  reduction=n.attrs["reduction"], ignore_index=n.attrs["ignore_index"])
    if g[1]:  # log_prob is used downstream too
        d2 = gb.op("LogSoftmaxGrad", n.outputs[1], g[1], axis=1)
        d = gb.op("Add", d, d2) if d else d2
    return [d, *([None] * (len(n.inputs) - 1))]


def _sce_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _sce_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    if not fast(len(ins[1].shape), len(ins) - 1, attrs):
        return nll.ws_bytes(ins[1])
    rows = ins[1].shape[0]
    return align_up(rows * ins[2].dtype.itemsize) + align_up(rows * ins[1].dtype.itemsize)


def _sce_grad(k: KernelArgs) -> Step:
    if not fast(k.ins[1].ndim, len(k.ins) - 1, k.attrs):
        return nll.sce_grad_kernel(k)
    xp, (dloss, logp, labels), dx = k.xp, k.ins, k.outs[0]
    b, c = logp.shape
    inv = 1.0 / b if k.attrs["reduction"] == "mean" else 1.0
    if not is_numpy(xp) and logp.flags.c_contiguous and dx.flags.c_contiguous:
        kernel = xp.ElementwiseKernel(*_SCE_GRAD)
        seed = dloss.reshape(1)  # a view: raw indexing of a 1-d array
        return lambda: kernel(logp, labels, seed, c, inv, dx)
    idx = k.scratch(0, (b,), labels.dtype)
    picked = k.scratch(align_up(b * labels.dtype.itemsize), (b,), logp.dtype)
    make_idx = row_index_step(xp, idx, labels, c, check=False)
    flat = dx.reshape(-1)
    seeded = scale_by_seed(xp, dx, dloss, inv)

    def step() -> None:
        xp.exp(logp, out=dx)  # softmax
        make_idx()
        take_rows(xp, flat, idx, picked)
        xp.subtract(picked, 1, out=picked)  # minus the one-hot target
        xp.put(flat, idx, picked, mode="clip")
        seeded()

    return step


SCE = jit.variants(_sce, _sce_fused, _sce_ws,
                   "2-D scores: log-softmax, the labelled entries and the loss in one pass "
                   "over the rows")
SCE_GRAD = jit.variants(_sce_grad, _sce_grad_fused, _sce_grad_ws,
                        "2-D scores: numpy's exp, then the one-hot labels subtracted and the "
                        "scale applied in one pass over the rows")


def _pair_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"prediction {ins[0].shape} and target {ins[1].shape} differ")
    return [TensorDesc(dt, ())]


def _pair_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ins[0].nbytes()


def _mean_square(k: KernelArgs, root: bool) -> Step:
    xp, (p, t), y = k.xp, k.ins, k.outs[0]
    d = k.scratch(0, p.shape, p.dtype)
    inv = 1.0 / max(p.size, 1)

    def step() -> None:
        xp.subtract(p, t, out=d)
        xp.multiply(d, d, out=d)
        xp.sum(d, out=y)
        xp.multiply(y, inv, out=y)
        if root:
            xp.sqrt(y, out=y)

    return step


def _mse(k: KernelArgs) -> Step:
    return _mean_square(k, root=False)


def _rmse(k: KernelArgs) -> Step:
    return _mean_square(k, root=True)


def _g_mse(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    dp = gb.op("MSELossGrad", g[0], n.inputs[0], n.inputs[1])
    return [dp, gb.op("Neg", dp)]


def _mse_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _mse_grad(k: KernelArgs) -> Step:
    xp, (dl, p, t), dx = k.xp, k.ins, k.outs[0]
    seeded = scale_by_seed(xp, dx, dl, 2.0 / max(p.size, 1))

    def step() -> None:
        xp.subtract(p, t, out=dx)
        seeded()

    return step


def _mae(k: KernelArgs) -> Step:
    """mean(|prediction - target|)."""
    xp, (p, t), y = k.xp, k.ins, k.outs[0]
    d = k.scratch(0, p.shape, p.dtype)
    inv = 1.0 / max(p.size, 1)

    def step() -> None:
        xp.subtract(p, t, out=d)
        xp.abs(d, out=d)
        xp.sum(d, out=y)
        xp.multiply(y, inv, out=y)

    return step


def _g_mae(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    dp = gb.op("MAELossGrad", g[0], n.inputs[0], n.inputs[1])
    return [dp, gb.op("Neg", dp)]


def _mae_grad(k: KernelArgs) -> Step:
    xp, (dl, p, t), dx = k.xp, k.ins, k.outs[0]
    seeded = scale_by_seed(xp, dx, dl, 1.0 / max(p.size, 1))

    def step() -> None:
        xp.subtract(p, t, out=dx)
        xp.sign(dx, out=dx)
        seeded()

    return step


def _huber_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    if not float(attrs["delta"]) > 0.0:
        raise ShapeError(f"HuberLoss delta must be positive, got {attrs['delta']}")
    return _pair_shape(ins, attrs)


def _huber_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return align_up(ins[0].nbytes()) + ins[0].dtype.itemsize  # |d| terms, a partial sum


def _huber(k: KernelArgs) -> Step:
    """mean(0.5 q^2 + delta (|d| - q)) with d = prediction - target and
    q = min(|d|, delta): 0.5 d^2 where |d| <= delta, delta (|d| - delta / 2) beyond.
    The two terms are summed one after the other through one scratch of d's shape
    (d is recomputed rather than kept in a second one)."""
    xp, (p, t), y = k.xp, k.ins, k.outs[0]
    d = k.scratch(0, p.shape, p.dtype)
    part = k.scratch(align_up(d.nbytes), (), p.dtype)
    delta = float(k.attrs["delta"])
    inv = 1.0 / max(p.size, 1)

    def step() -> None:
        xp.subtract(p, t, out=d)
        xp.abs(d, out=d)
        xp.subtract(d, delta, out=d)
        xp.maximum(d, 0.0, out=d)  # |d| - q
        xp.sum(d, out=y)
        xp.multiply(y, delta, out=y)
        xp.subtract(p, t, out=d)
        xp.abs(d, out=d)
        xp.minimum(d, delta, out=d)  # q
        xp.multiply(d, d, out=d)
        xp.sum(d, out=part)
        xp.multiply(part, 0.5, out=part)
        xp.add(y, part, out=y)
        xp.multiply(y, inv, out=y)

    return step


def _g_huber(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None, None]
    dp = gb.op("HuberLossGrad", g[0], n.inputs[0], n.inputs[1], delta=n.attrs["delta"])
    return [dp, gb.op("Neg", dp)]


def _huber_grad(k: KernelArgs) -> Step:
    xp, (dl, p, t), dx = k.xp, k.ins, k.outs[0]
    delta = float(k.attrs["delta"])
    seeded = scale_by_seed(xp, dx, dl, 1.0 / max(p.size, 1))

    def step() -> None:
        xp.subtract(p, t, out=dx)
        xp.minimum(dx, delta, out=dx)
        xp.maximum(dx, -delta, out=dx)
        seeded()

    return step


def _accuracy_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    scores = ins[0]
    need_float(scores, "Accuracy scores")
    if len(scores.shape) not in (2, 3):
        raise ShapeError(f"Accuracy: scores must be [batch, classes] or [batch, models, "
                         f"classes], got {scores.shape}")
    check_labels(ins[1], scores.shape[:1], scores.shape, "Accuracy")
    return [TensorDesc(scores.dtype, scores.shape[1:-1])]


def _accuracy_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    n = ins[0].numel() // ins[0].shape[-1]
    return align_up(n * 8) * 2 + n


def _accuracy_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                    ) -> int:
    """The arg-max, 1 per score; the comparison with the label and the count, 1 per row
    each."""
    scores = ins[0]
    return scores.numel() + 2 * (scores.numel() // max(scores.shape[-1], 1))


def _accuracy(k: KernelArgs) -> Step:
    """The fraction of rows whose highest score is the label; with scores
    ``[b, K, C]`` (a stack of K models), one fraction per model."""
    xp, (x, labels), y = k.xp, k.ins, k.outs[0]
    rows = x.shape[:-1]
    n = x.size // x.shape[-1]
    arg = k.scratch(0, rows, labels.dtype)
    count = k.scratch(align_up(n * 8), rows[1:], labels.dtype)
    hit = k.scratch(align_up(n * 8) * 2, rows, "bool")
    lab = labels if x.ndim == 2 else labels.reshape(-1, 1)
    inv = 1.0 / max(x.shape[0], 1)

    def step() -> None:
        xp.argmax(x, axis=-1, out=arg)
        xp.equal(arg, lab, out=hit)
        xp.sum(hit, axis=0, out=count)
        xp.multiply(count, inv, out=y)

    return step


def _dropout_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    need_float(ins[0])
    if not 0.0 <= float(attrs["ratio"]) < 1.0:
        raise ShapeError(f"Dropout ratio must be in [0, 1), got {attrs['ratio']}")
    return [ins[0], TensorDesc(DType.BOOL, ins[0].shape)]


def _dropout_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    return ins[0].nbytes() if attrs["training"] else 0


def _dropout_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """Training, the scale by 1/(1 - ratio): 1 per element (the draw is not arithmetic);
    otherwise the identity."""
    return outs[0].numel() if attrs["training"] and float(attrs["ratio"]) > 0.0 else 0


def _dropout_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                        ) -> int:
    """dY masked and scaled, 1 per element; at ratio 0 (not training) a copy."""
    return outs[0].numel() if float(attrs["ratio"]) > 0.0 else 0


def _dropout(k: KernelArgs) -> Step:
    xp, x, (y, mask) = k.xp, k.ins[0], k.outs
    ratio = float(k.attrs["ratio"])
    if not k.attrs["training"] or ratio == 0.0:

        def identity() -> None:
            xp.copyto(y, x)
            mask.fill(True)

        return identity
    u = k.scratch(0, x.shape, x.dtype)
    scale = 1.0 / (1.0 - ratio)
    rng = k.rng

    # A masked copy rather than multiplying by the bool mask: a mixed-dtype ufunc call
    # allocates a cast buffer (and cupy's ufuncs take no where=; its copyto does).
    def step() -> None:
        rng.random(out=u, dtype=u.dtype)
        xp.greater_equal(u, ratio, out=mask)
        y.fill(0)
        xp.copyto(y, x, where=mask)
        xp.multiply(y, scale, out=y)

    return step


def _g_dropout(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None]
    ratio = float(n.attrs["ratio"]) if n.attrs["training"] else 0.0
    return [gb.op("DropoutGrad", g[0], n.outputs[1], ratio=ratio)]


def _dropout_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[0]]


def _dropout_grad(k: KernelArgs) -> Step:
    xp, (dy, mask), dx = k.xp, k.ins, k.outs[0]
    scale = 1.0 / (1.0 - float(k.attrs["ratio"]))

    def step() -> None:
        dx.fill(0)
        xp.copyto(dx, dy, where=mask)
        xp.multiply(dx, scale, out=dx)

    return step


def _import_dropout(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
                    ) -> tuple[list[str], dict[str, Any]]:
    """Ratio and training_mode inputs: the path decides (training with a loss)."""
    attrs = {"ratio": attrs.get("ratio", 0.5)} if ctx.training else {"training": 0}
    if ctx.training and len(node.input) > 1 and node.input[1]:
        attrs["ratio"] = float(ctx.const(node.input[1], node))
    return ins[:1], attrs


def _export_dropout(n: Node, helper: Any, nh: Any) -> Exported:
    """The identity it is at inference."""
    return [helper.make_node("Identity", [n.inputs[0]], [n.outputs[0]])], []


OPS = [
    OpDef(name="SoftmaxCrossEntropyLoss", shape=_sce_shape,
          flops=nll.sce_flops,
          kernel=jit.by_size("SoftmaxCrossEntropyLoss", SCE), variants=SCE, grad=_g_sce,
          workspace=_sce_ws, num_inputs=(2, 3), num_outputs=2,
          attrs={"reduction": "mean", "ignore_index": None}, stacking=StackRule.LOSS,
          onnx=OnnxForm(name="SoftmaxCrossEntropyLoss"),
          doc="ONNX SoftmaxCrossEntropyLoss: cross-entropy of softmax(scores) (over axis 1) "
              "against integer labels, with optional class weights and ignore_index; "
              "outputs loss, log_prob"),
    OpDef(name="SoftmaxCrossEntropyLossGrad", shape=_sce_grad_shape,
          flops=nll.sce_grad_flops,
          kernel=jit.by_size("SoftmaxCrossEntropyLossGrad", SCE_GRAD), variants=SCE_GRAD,
          grad=FIRST_ORDER_ONLY, workspace=_sce_grad_ws, num_inputs=(3, 4),
          attrs={"reduction": "mean", "ignore_index": None}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL, doc="internal: (exp(log_prob) - onehot(labels)) * weighted dloss"),
    OpDef(name="MSELoss", shape=_pair_shape, kernel=_mse, grad=_g_mse, workspace=_pair_ws,
          flops=per_input(3),
          num_inputs=(2, 2), stacking=NOT_STACKED, onnx=NOT_IN_ONNX,
          doc="mean((prediction - target)^2)"),
    OpDef(name="MSELossGrad", shape=_mse_grad_shape, kernel=_mse_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(2),
          num_inputs=(3, 3), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: 2 * (prediction - target) * dloss / n"),
    OpDef(name="MAELoss", shape=_pair_shape, kernel=_mae, grad=_g_mae, workspace=_pair_ws,
          flops=per_input(3),
          num_inputs=(2, 2), stacking=NOT_STACKED, onnx=NOT_IN_ONNX,
          doc="mean(|prediction - target|) over every element (torch's L1Loss)"),
    OpDef(name="MAELossGrad", shape=_mse_grad_shape, kernel=_mae_grad, grad=FIRST_ORDER_ONLY,
          flops=per_output(3),
          num_inputs=(3, 3), stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: sign(prediction - target) * dloss / n"),
    OpDef(name="HuberLoss", shape=_huber_shape, kernel=_huber, grad=_g_huber,
          flops=per_input(6),
          workspace=_huber_ws, num_inputs=(2, 2), attrs={"delta": 1.0}, stacking=NOT_STACKED,
          onnx=NOT_IN_ONNX,
          doc="mean over elements of 0.5 d^2 where |d| <= delta, else delta (|d| - delta/2), "
              "d = prediction - target (torch's HuberLoss, reduction='mean')"),
    OpDef(name="HuberLossGrad", shape=_mse_grad_shape, kernel=_huber_grad,
          flops=per_output(3),
          grad=FIRST_ORDER_ONLY, num_inputs=(3, 3), attrs={"delta": 1.0},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: clip(prediction - target, -delta, delta) * dloss / n"),
    OpDef(name="Accuracy", shape=_accuracy_shape, kernel=_accuracy, grad=NON_DIFFERENTIABLE_METRIC,
          flops=_accuracy_flops,
          workspace=_accuracy_ws, num_inputs=(2, 2), stacking=StackRule.METRIC, onnx=NOT_IN_ONNX,
          doc="fraction of rows whose argmax equals the label"),
    OpDef(name="RMSE", shape=_pair_shape, kernel=_rmse, grad=NON_DIFFERENTIABLE_METRIC,
          flops=per_input(3),
          workspace=_pair_ws, num_inputs=(2, 2), stacking=NOT_STACKED, onnx=NOT_IN_ONNX,
          doc="sqrt(mean((prediction - target)^2))"),
    OpDef(name="Dropout", shape=_dropout_shape, kernel=_dropout, grad=_g_dropout,
          flops=_dropout_flops,
          workspace=_dropout_ws, num_outputs=2, attrs={"ratio": 0.5, "training": None},
          doc="training: zero each element with probability ratio and scale the rest by "
              "1/(1-ratio); outputs y and the mask.  training defaults to the path's mode",
          pure=False, stacking=StackRule.ELEMENTWISE,
          onnx=OnnxForm(name="Dropout", export=_export_dropout, import_=_import_dropout,
                        attr_inputs=(1, 2))),
    OpDef(name="DropoutGrad", shape=_dropout_grad_shape, kernel=_dropout_grad,
          flops=_dropout_grad_flops,
          grad=FIRST_ORDER_ONLY, num_inputs=(2, 2), attrs={"ratio": 0.5},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: dy * mask / (1 - ratio)"),
]
