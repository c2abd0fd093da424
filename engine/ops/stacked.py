"""Ops over a *stack* of K models trained side by side (horizontal fusion; see
:mod:`engine.compile.stack`).  A stacked activation is laid out ``[batch, K, ...]`` (the
batch stays the leading, generic dimension); a stacked parameter ``[K, ...]``.

- ``StackedGemm(A, W[, b])``: ``Y[:, k] = A_k @ W[k] (+ b[k])`` with ``A`` either
  shared by the models (``[b, in]``, the data) or stacked (``[b, K, in]``), ``W``
  ``[K, in, out]`` (``[K, out, in]`` with ``transB``; ``[in, K, out]`` with
  ``model_axis=1``, for shared data) and ``Y`` ``[b, K, out]``.
- ``StackedGemmGradInput`` and ``StackedGemmGradWeight``: its gradients.
- ``StackedSoftmaxCrossEntropyLoss(scores [b, K, C], labels [b])``: one mean loss
  per model (``[K]``) and the log-probabilities.

On numpy each model's product is one BLAS call on strided 2-D views, written straight
into the ``[b, K, out]`` layout: BLAS takes the row stride, nothing is copied; shared
data and ``[in, K, out]`` (or ``[K, out, in]``) weights make the K products one GEMM.
That is the variant ``blas``; ``batched`` is numpy's own broadcast ``matmul`` over the
model axis (one call: faster for small layers, 1.5-2x slower for some larger ones);
``sparse`` (shared data, ``[in, K, out]`` weights) skips the data's zeros: each
nonzero ``A[i, p]`` adds ``A[i, p]`` times row ``p`` of ``[in, K*out]`` to row ``i`` of
``Y``, compiled (:mod:`engine.ops._jit_kernels`), on every core when BLAS runs on one
(:func:`engine.ops.jit.parallel_threads`).  A layer's product and its two gradients are one
group: they choose their form together.
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops import jit
from engine.ops._base import (
    ALREADY_STACKED,
    FIRST_ORDER_ONLY,
    MADE_AFTER_STACKING,
    VARIANT_ATTR,
    GradBuilder,
    KernelArgs,
    NodeView,
    OpDef,
    Step,
    Variant,
    is_numpy,
    need_float,
    no_workspace,
    pick_variant,
    same_dtype,
)
from engine.ops._onnx import ENGINE_INTERNAL
from engine.ops.elementwise import unbroadcast
from engine.ops.loss import check_labels, labels_out_of_range, row_index_step, take_rows
from engine.ops.reduce import SOFTMAX_FLOPS, log_softmax_step
from engine.ops.strided_gemm import matmul_step, strided_matmul


def _weight_dims(w: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, int, int]:
    """(K, in, out) of a stacked weight."""
    if len(w) != 3:
        raise ShapeError(f"a stacked weight is [models, in, out], got {w}")
    if attrs.get("model_axis"):
        if attrs["transB"]:
            raise ShapeError("a stacked weight [in, models, out] (model_axis=1) is not "
                             "read transposed")
        return (w[1], w[0], w[2])
    return (w[0], w[2], w[1]) if attrs["transB"] else (w[0], w[1], w[2])


def _interleaved(attrs: dict[str, Any], a_shape: tuple[int, ...], what: str) -> bool:
    """Whether the weight is ``[in, K, out]``; it must then be fed shared data."""
    if not attrs.get("model_axis"):
        return False
    if len(a_shape) != 2:
        raise ShapeError(f"{what}: a weight [in, models, out] (model_axis=1) needs an "
                         f"input the models share, [b, in], got {a_shape}")
    return True


def _check_input(a: tuple[int, ...], models: int, n_in: int, what: str) -> None:
    if len(a) == 2 and a[1] == n_in:
        return
    if len(a) == 3 and a[1:] == (models, n_in):
        return
    raise ShapeError(f"{what}: input {a} is neither [b, {n_in}] nor [b, {models}, {n_in}]")


def _sgemm_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins)
    need_float(ins[0])
    models, n_in, n_out = _weight_dims(ins[1].shape, attrs)
    _check_input(ins[0].shape, models, n_in, "StackedGemm")
    _interleaved(attrs, ins[0].shape, "StackedGemm")
    if len(ins) == 3 and ins[2].shape != (models, n_out):
        raise ShapeError(f"StackedGemm: bias {ins[2].shape} is not [{models}, {n_out}]")
    return [TensorDesc(dt, (ins[0].shape[0], models, n_out))]


def _sgemm_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """K models' products, 2·in per element of Y ``[b, K, out]``, and the bias 1 each.
    The sparse variant counts this too: MFU counts the dense model's arithmetic, not
    the zeros a kernel skipped."""
    n_in = _weight_dims(ins[1].shape, attrs)[1]
    y = outs[0].numel()
    return 2 * y * n_in + (y if len(ins) == 3 else 0)


def _grad_input_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                      ) -> int:
    """dA = dY·W^T per model, 2·in per element of dY (a shared input's sum over the models
    is that product's accumulation)."""
    return 2 * ins[0].numel() * _weight_dims(ins[1].shape, attrs)[1]


def _grad_weight_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                       ) -> int:
    """dW = A^T·dY per model, 2·in per element of dY."""
    return 2 * ins[1].numel() * ins[0].shape[-1]


def _members(x: Any, models: int) -> list[Any]:
    """Per-model 2-D views of a ``[b, K, n]`` array (or K times a shared ``[b, n]``)."""
    return [x] * models if x.ndim == 2 else [x[:, i, :] for i in range(models)]


def _weights(w: Any, trans: Any) -> list[Any]:
    """Per-model 2-D views ``[in, out]`` of a ``[K, ...]`` weight (``[out, in]`` if
    ``trans``)."""
    return [w[i].T if trans else w[i] for i in range(w.shape[0])]


def _products(xp: Any, triples: list[tuple[Any, Any, Any]]) -> Step:
    """Each ``(a, b, y)``: ``y = a @ b`` (on a GPU through cuBLAS where the views allow:
    :func:`~engine.ops.strided_gemm.matmul_step`)."""
    steps = [matmul_step(xp, a, b, y) for a, b, y in triples]

    def step() -> None:
        for f in steps:
            f()

    return step


def _batched_on_device(xp: Any, a: Any, w_k: Any, y: Any) -> Step | None:
    """All the models' products in one strided cuBLAS call (a GPU; None elsewhere):
    ``a`` and ``y`` ``[b, K, n]`` (``a`` may be a shared ``[b, n]``), ``w_k``
    ``[K, n_in, n_out]``."""
    return strided_matmul(xp, _stack_axis(a), w_k, _stack_axis(y))


def _one_gemm(a: Any, w: Any, trans_b: Any) -> bool:
    """Shared input and ``[K, out, in]`` weights: all the models in one GEMM."""
    return a.ndim == 2 and bool(trans_b)


def _sgemm(k: KernelArgs) -> Step:
    xp, a, w, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    models = w.shape[0]
    if k.attrs.get("model_axis"):  # Y [b, K*out] = A @ W [in, K*out]
        prods = _products(xp, [(a, w.reshape(w.shape[0], -1), y.reshape(y.shape[0], -1))])
    elif _one_gemm(a, w, k.attrs["transB"]):  # Y [b, K*out] = A @ Wcat^T
        y2, wt = y.reshape(y.shape[0], -1), w.reshape(-1, w.shape[2]).T
        prods = _products(xp, [(a, wt, y2)])
    else:
        w_k = w.transpose(0, 2, 1) if k.attrs["transB"] else w
        prods = _batched_on_device(xp, a, w_k, y) or _products(
            xp, list(zip(_members(a, models), _weights(w, k.attrs["transB"]),
                         _members(y, models), strict=True)))
    return _with_bias(xp, prods, y, k.ins)


def _with_bias(xp: Any, prods: Step, y: Any, ins: list[Any]) -> Step:
    """``prods``, then the models' biases ``[K, out]`` (a third input) added to ``y``."""
    if len(ins) == 2:
        return prods
    bias = ins[2]

    def step() -> None:
        prods()
        xp.add(y, bias, out=y)

    return step


def _g_sgemm(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if not g[0]:
        return [None] * len(n.inputs)
    a, w = n.inputs[:2]
    form = {"transB": int(n.attrs["transB"]), "model_axis": int(n.attrs.get("model_axis", 0))}
    shared = int(len(gb.desc(a).shape) == 2)
    out: list[str | None] = [
        gb.op("StackedGemmGradInput", g[0], w, shared=shared, **form),
        gb.op("StackedGemmGradWeight", a, g[0], **form),
    ]
    if len(n.inputs) == 3:
        out.append(unbroadcast(gb, g[0], n.inputs[2]))
    return out


def _grad_input_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dy, w = ins[0].shape, ins[1].shape
    models, n_in, _ = _weight_dims(w, attrs)
    if attrs.get("model_axis") and not attrs["shared"]:
        raise ShapeError("StackedGemmGradInput: a weight [in, models, out] (model_axis=1) "
                         "is fed an input the models share")
    shape = (dy[0], n_in) if attrs["shared"] else (dy[0], models, n_in)
    return [TensorDesc(same_dtype(ins), shape)]


def _grad_input_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                   device: str) -> int:
    return outs[0].nbytes() if attrs["shared"] else 0


def _grad_input(k: KernelArgs) -> Step:
    """dA_k = dY_k @ W_k^T; a shared input sums the models' contributions."""
    xp, dy, w, da = k.xp, k.ins[0], k.ins[1], k.outs[0]
    models = w.shape[0]
    if k.attrs.get("model_axis"):  # dA = dY [b, K*out] @ W [in, K*out]^T
        return _products(xp, [(dy.reshape(dy.shape[0], -1), w.reshape(w.shape[0], -1).T, da)])
    if _one_gemm(da, w, k.attrs["transB"]):  # dA = dY [b, K*out] @ Wcat [K*out, in]
        return _products(xp, [(dy.reshape(dy.shape[0], -1), w.reshape(-1, w.shape[2]), da)])
    wt = _weights(w, not k.attrs["transB"])
    dys = _members(dy, models)
    if not k.attrs["shared"]:
        wt_k = w if k.attrs["transB"] else w.transpose(0, 2, 1)  # [K, out, in]
        return _batched_on_device(xp, dy, wt_k, da) or _products(
            xp, list(zip(dys, wt, _members(da, models), strict=True)))
    tmp = k.scratch(0, da.shape, da.dtype)
    first = matmul_step(xp, dys[0], wt[0], da)
    rest = [matmul_step(xp, d, t, tmp) for d, t in zip(dys[1:], wt[1:], strict=True)]

    def step() -> None:
        first()
        for product in rest:
            product()
            xp.add(da, tmp, out=da)

    return step


def _grad_weight_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    a, dy = ins[0].shape, ins[1].shape
    if len(dy) != 3:
        raise ShapeError(f"StackedGemmGradWeight: dY must be [b, K, out], got {dy}")
    models, n_out = dy[1], dy[2]
    n_in = a[-1]
    _check_input(a, models, n_in, "StackedGemmGradWeight")
    if _interleaved(attrs, a, "StackedGemmGradWeight"):
        return [TensorDesc(same_dtype(ins), (n_in, models, n_out))]
    shape = (models, n_out, n_in) if attrs["transB"] else (models, n_in, n_out)
    return [TensorDesc(same_dtype(ins), shape)]


def _grad_weight(k: KernelArgs) -> Step:
    """dW_k = A_k^T @ dY_k (its transpose with ``transB``)."""
    xp, a, dy, dw = k.xp, k.ins[0], k.ins[1], k.outs[0]
    models = dw.shape[0]
    if k.attrs.get("model_axis"):  # dW [in, K*out] = A^T @ dY [b, K*out]
        return _products(xp, [(a.T, dy.reshape(dy.shape[0], -1), dw.reshape(dw.shape[0], -1))])
    if _one_gemm(a, dw, k.attrs["transB"]):  # dWcat [K*out, in] = dY^T @ A
        return _products(xp, [(dy.reshape(dy.shape[0], -1).T, a, dw.reshape(-1, dw.shape[2]))])
    a_k, dy_k = _stack_axis(a), _stack_axis(dy)  # on a GPU, all the models in one call
    one = strided_matmul(xp, dy_k.transpose(0, 2, 1), a_k, dw) if k.attrs["transB"] \
        else strided_matmul(xp, a_k.transpose(0, 2, 1), dy_k, dw)
    if one is not None:
        return one
    pairs = zip(_members(a, models), _members(dy, models), strict=True)
    if k.attrs["transB"]:
        triples = [(d.T, x, dw[i]) for i, (x, d) in enumerate(pairs)]
    else:
        triples = [(x.T, d, dw[i]) for i, (x, d) in enumerate(pairs)]
    return _products(xp, triples)


# -- the batched form: one broadcast matmul over the model axis --------------------------


def _stack_axis(x: Any) -> Any:
    """``[b, K, n]`` as ``[K, b, n]`` (a view); a shared ``[b, n]`` as ``[1, b, n]``."""
    return x[None] if x.ndim == 2 else x.transpose(1, 0, 2)


def _sgemm_batched(k: KernelArgs) -> Step:
    xp, a, w, y = k.xp, k.ins[0], k.ins[1], k.outs[0]
    a_k, y_k = _stack_axis(a), _stack_axis(y)
    w_k = w.transpose(0, 2, 1) if k.attrs["transB"] else w  # [K, in, out]
    bias = k.ins[2] if len(k.ins) == 3 else None

    product = matmul_step(xp, a_k, w_k, y_k)

    def step() -> None:
        product()
        if bias is not None:
            xp.add(y, bias, out=y)

    return step


def _grad_input_batched_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                           device: str) -> int:
    models = ins[1].shape[0]
    return align_up(models * outs[0].nbytes()) if attrs["shared"] else 0


def _grad_input_batched(k: KernelArgs) -> Step:
    """dA_k = dY_k @ W_k^T for all k in one call; a shared input's K products are
    summed over the model axis from the workspace."""
    xp, dy, w, da = k.xp, k.ins[0], k.ins[1], k.outs[0]
    models = w.shape[0]
    dy_k = _stack_axis(dy)
    wt_k = w if k.attrs["transB"] else w.transpose(0, 2, 1)  # [K, out, in]
    if not k.attrs["shared"]:
        return matmul_step(xp, dy_k, wt_k, _stack_axis(da))
    parts = k.scratch(0, (models, *da.shape), da.dtype)
    product = matmul_step(xp, dy_k, wt_k, parts)

    def step() -> None:
        product()
        xp.sum(parts, axis=0, out=da)

    return step


def _grad_weight_batched(k: KernelArgs) -> Step:
    """dW_k = A_k^T @ dY_k (its transpose with ``transB``) for all k in one call."""
    xp, a, dy, dw = k.xp, k.ins[0], k.ins[1], k.outs[0]
    a_k, dy_k = _stack_axis(a), _stack_axis(dy)
    if k.attrs["transB"]:
        return matmul_step(xp, dy_k.transpose(0, 2, 1), a_k, dw)
    return matmul_step(xp, a_k.transpose(0, 2, 1), dy_k, dw)


def _always(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> bool:
    return True


def _not_interleaved(ins: list[TensorDesc], outs: list[TensorDesc],
                     attrs: dict[str, Any]) -> bool:
    return not attrs.get("model_axis")


def _interleaved_floats(ins: list[TensorDesc], outs: list[TensorDesc],
                        attrs: dict[str, Any]) -> bool:
    return bool(attrs.get("model_axis")) and all(d.dtype.is_float for d in (*ins, *outs))


# -- the sparse form: a shared input's zeros skipped -----------------------------------------


def _sparse_kernels(k: KernelArgs) -> Any | None:
    """The compiled kernels where they can run on these views (numpy, one dtype,
    C-contiguous), else None: the variant then runs ``blas``'s kernel."""
    ks = jit.kernels() if is_numpy(k.xp) else None
    arrays = [*k.ins[:2], *k.outs]
    if ks is None or len({a.dtype for a in arrays}) != 1 or \
            not all(a.flags.c_contiguous for a in arrays):
        return None
    return ks


def _over_rows(serial: Any, parallel: Any, rows: int, *args: Any) -> Step:
    """``serial(*args, 0, rows)``, or ``parallel(*args, parts)``: the rows split over
    numba's threads where :func:`engine.ops.jit.parallel_threads` allows."""
    parts = min(jit.parallel_threads(), rows)
    if parts > 1:
        return lambda: parallel(*args, parts)
    return lambda: serial(*args, 0, rows)


def _sgemm_sparse(k: KernelArgs) -> Step:
    """Y [b, K*out] = A @ W [in, K*out], each row of A's nonzeros only."""
    ks = _sparse_kernels(k)
    if ks is None:
        return _sgemm(k)
    a, w, y = k.ins[0], k.ins[1], k.outs[0]
    prods = _over_rows(ks.sparse_rows_product, ks.sparse_rows_product_parallel, a.shape[0],
                       a, w.reshape(w.shape[0], -1), y.reshape(y.shape[0], -1))
    return _with_bias(k.xp, prods, y, k.ins)


def _grad_weight_sparse(k: KernelArgs) -> Step:
    """dW [in, K*out] = A^T @ dY [b, K*out], each column of A's nonzeros only."""
    ks = _sparse_kernels(k)
    if ks is None:
        return _grad_weight(k)
    a, dy, dw = k.ins[0], k.ins[1], k.outs[0]
    return _over_rows(ks.sparse_rows_weight_grad, ks.sparse_rows_weight_grad_parallel,
                      dw.shape[0], a, dy.reshape(dy.shape[0], -1), dw.reshape(dw.shape[0], -1))


STACKED_FORM = "stacked form"  # a stacked layer's products choose their form together
_BLAS_DOC = "one BLAS call per model on strided views (one GEMM for shared data and " \
    "[K, out, in] weights)"
_BATCHED_DOC = "one broadcast matmul over the model axis"
_SPARSE_DOC = "shared data's zeros skipped: each nonzero adds its row of the [in, K*out] " \
    "weight (compiled; on numba's threads beside a one-thread BLAS)"
SGEMM_VARIANTS: dict[str, Variant] = {
    "blas": Variant(applies=_always, workspace=no_workspace, kernel=_sgemm,
                    group=STACKED_FORM, doc=_BLAS_DOC),
    "batched": Variant(applies=_not_interleaved, workspace=no_workspace,
                       kernel=_sgemm_batched, group=STACKED_FORM, doc=_BATCHED_DOC),
    "sparse": Variant(applies=_interleaved_floats, workspace=no_workspace,
                      kernel=_sgemm_sparse, group=STACKED_FORM, doc=_SPARSE_DOC),
}
GRAD_INPUT_VARIANTS: dict[str, Variant] = {
    "blas": Variant(applies=_always, workspace=_grad_input_ws, kernel=_grad_input,
                    group=STACKED_FORM, doc=_BLAS_DOC + "; a shared input sums them"),
    "batched": Variant(applies=_not_interleaved, workspace=_grad_input_batched_ws,
                       kernel=_grad_input_batched, group=STACKED_FORM,
                       doc=_BATCHED_DOC + "; a shared input sums the K products after"),
    "sparse": Variant(applies=_interleaved_floats, workspace=_grad_input_ws,
                      kernel=_grad_input, group=STACKED_FORM,
                      doc="the sparse form's input gradient, dense: as blas"),
}
GRAD_WEIGHT_VARIANTS: dict[str, Variant] = {
    "blas": Variant(applies=_always, workspace=no_workspace, kernel=_grad_weight,
                    group=STACKED_FORM, doc=_BLAS_DOC),
    "batched": Variant(applies=_not_interleaved, workspace=no_workspace,
                       kernel=_grad_weight_batched, group=STACKED_FORM, doc=_BATCHED_DOC),
    "sparse": Variant(applies=_interleaved_floats, workspace=no_workspace,
                      kernel=_grad_weight_sparse, group=STACKED_FORM, doc=_SPARSE_DOC),
}


# Per-model weights of at most this many elements (in x out) take the batched form by
# default on the CPU: numpy's one broadcast matmul saves a call per model, which at a
# 64-wide layer is a fifth to two fifths of the products' time; from 256 x 256 up a
# BLAS call per model is as fast or faster (docs/measurements.md, "Stacks").
SMALL_WEIGHT = 128 * 128


def _by_size(op: str, variants: dict[str, Variant], weight: int, shared: Any
             ) -> tuple[Any, Any]:
    """``dispatch_variants``, but with ``"batched"`` the default (no variant named) on
    the CPU for per-model weights of :data:`SMALL_WEIGHT` elements at most that are not
    fed a shared input.  ``weight``: which of the ins (or -1: the output) has the
    weight's shape; ``shared(ins, attrs)``: whether the input is the models' shared."""

    def pick(ins: list[Any], outs: list[Any], attrs: dict[str, Any], cpu: bool) -> Variant:
        if attrs.get(VARIANT_ATTR) or not cpu or attrs.get("model_axis") or \
                shared(ins, attrs):
            return pick_variant(op, variants, attrs)
        w = tuple((outs[0] if weight < 0 else ins[weight]).shape)
        _, n_in, n_out = _weight_dims(w, attrs)
        name = "batched" if n_in * n_out <= SMALL_WEIGHT else next(iter(variants))
        return variants[name]

    def kernel(k: KernelArgs) -> Step:
        return pick(k.ins, k.outs, k.attrs, is_numpy(k.xp)).kernel(k)

    def workspace(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                  device: str) -> int:
        return pick(ins, outs, attrs, device == "cpu").workspace(ins, outs, attrs, device)

    return kernel, workspace


_SGEMM = _by_size("StackedGemm", SGEMM_VARIANTS, 1, lambda ins, attrs: len(ins[0].shape) == 2)
_GRAD_INPUT = _by_size("StackedGemmGradInput", GRAD_INPUT_VARIANTS, 1,
                       lambda ins, attrs: bool(attrs.get("shared")))
_GRAD_WEIGHT = _by_size("StackedGemmGradWeight", GRAD_WEIGHT_VARIANTS, -1,
                        lambda ins, attrs: len(ins[0].shape) == 2)


# -- the loss -------------------------------------------------------------------------


def _ssce_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    scores, labels = ins
    need_float(scores, "StackedSoftmaxCrossEntropyLoss scores")
    if len(scores.shape) != 3:
        raise ShapeError(f"StackedSoftmaxCrossEntropyLoss: scores must be [batch, models, "
                         f"classes], got {scores.shape}")
    check_labels(labels, scores.shape[:1], scores.shape, "StackedSoftmaxCrossEntropyLoss")
    if attrs["reduction"] not in ("mean", "sum"):
        raise ShapeError(f"reduction {attrs['reduction']!r} is not supported (mean, sum)")
    return [TensorDesc(scores.dtype, scores.shape[1:2]), scores]


def _ssce_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """Each model's cross-entropy: 5 per score and 1 per row (of b·K)."""
    s = ins[0]
    return SOFTMAX_FLOPS * s.numel() + s.numel() // max(s.shape[-1], 1)


def _ssce_grad_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]
                     ) -> int:
    """Each model's cross-entropy gradient: 2 per score and 1 per row (of b·K)."""
    s = ins[1]
    return 2 * s.numel() + s.numel() // max(s.shape[-1], 1)


def _ssce_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    b, m, _ = ins[0].shape
    return (align_up(b * m * ins[1].dtype.itemsize) + 2 * align_up(b * m * ins[0].dtype.itemsize)
            + ins[0].nbytes())  # index, picked values, row stats, exp scratch


def _ssce(k: KernelArgs) -> Step:
    xp, (x, labels), (loss, logp) = k.xp, k.ins, k.outs
    b, m, c = x.shape
    idx = k.scratch(0, (b, m), labels.dtype)
    o = align_up(b * m * labels.dtype.itemsize)
    picked = k.scratch(o, (b, m), x.dtype)
    o += align_up(b * m * x.dtype.itemsize)
    s = k.scratch(o, (b, m, 1), x.dtype)
    e = k.scratch(o + align_up(b * m * x.dtype.itemsize), (b, m, c), x.dtype)
    lsm = log_softmax_step(xp, x, logp, s, e, 2)
    make_idx = row_index_step(xp, idx, labels, c)
    flat, flat_idx, flat_picked = logp.reshape(-1), idx.reshape(-1), picked.reshape(-1)
    scale = -1.0 / b if k.attrs["reduction"] == "mean" else -1.0

    def step() -> None:
        lsm()
        make_idx()
        take_rows(xp, flat, flat_idx, flat_picked)
        xp.sum(picked, axis=0, out=loss)
        xp.multiply(loss, scale, out=loss)

    return step


def _g_ssce(gb: GradBuilder, n: NodeView, g: list[str | None]) -> list[str | None]:
    if g[1]:
        raise ShapeError("StackedSoftmaxCrossEntropyLoss: its log_prob output cannot be "
                         "differentiated through; use a LogSoftmax node for that")
    if not g[0]:
        return [None, None]
    return [gb.op("StackedSoftmaxCrossEntropyLossGrad", g[0], n.outputs[1], n.inputs[1],
                  reduction=n.attrs["reduction"]), None]


def _ssce_grad_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    return [ins[1]]


def _ssce_grad_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                  device: str) -> int:
    b, m, _ = ins[1].shape
    return (align_up(b * m * ins[2].dtype.itemsize) + align_up(b * m * ins[1].dtype.itemsize)
            + align_up(m * ins[1].dtype.itemsize))


def _ssce_grad(k: KernelArgs) -> Step:
    """d scores = (softmax - onehot) * dloss[k] / b, per model k."""
    xp, (dloss, logp, labels), dx = k.xp, k.ins, k.outs[0]
    b, m, c = logp.shape
    idx = k.scratch(0, (b, m), labels.dtype)
    o = align_up(b * m * labels.dtype.itemsize)
    picked = k.scratch(o, (b * m,), logp.dtype)
    coef = k.scratch(o + align_up(b * m * logp.dtype.itemsize), (m,), logp.dtype)
    make_idx = row_index_step(xp, idx, labels, c, check=False)
    flat, flat_idx = dx.reshape(-1), idx.reshape(-1)
    inv = 1.0 / b if k.attrs["reduction"] == "mean" else 1.0
    coef_b = coef.reshape(1, m, 1)

    def step() -> None:
        xp.exp(logp, out=dx)
        make_idx()
        take_rows(xp, flat, flat_idx, picked)
        xp.subtract(picked, 1, out=picked)
        xp.put(flat, flat_idx, picked, mode="clip")
        xp.multiply(dloss, inv, out=coef)
        xp.multiply(dx, coef_b, out=dx)

    return step


def _ssce_fused(k: KernelArgs, ks: Any) -> Step | None:
    """Each model's log-softmax, labelled entries and loss in one walk over the rows."""
    (x, labels), (loss, logp) = k.ins, k.outs
    if not all(a.flags.c_contiguous for a in (x, labels, loss, logp)):
        return None
    c = x.shape[2]
    run = ks.stacked_sce_forward
    scale = -1.0 / x.shape[0] if k.attrs["reduction"] == "mean" else -1.0

    def step() -> None:
        if run(x, labels, logp, loss, scale):
            raise labels_out_of_range(labels, c)

    return step


def _ssce_grad_fused(k: KernelArgs, ks: Any) -> Step | None:
    (dloss, logp, labels), dx = k.ins, k.outs[0]
    if not all(a.flags.c_contiguous for a in (dloss, logp, labels, dx)):
        return None
    xp, run = k.xp, ks.stacked_sce_grad
    inv = 1.0 / logp.shape[0] if k.attrs["reduction"] == "mean" else 1.0

    def step() -> None:
        xp.exp(logp, out=dx)  # softmax, numpy's SIMD exp
        run(dx, labels, dloss, inv)

    return step


SSCE = jit.variants(_ssce, _ssce_fused, _ssce_ws,
                    "each model's log-softmax, labelled entries and loss in one pass")
SSCE_GRAD = jit.variants(_ssce_grad, _ssce_grad_fused, _ssce_grad_ws,
                         "numpy's exp, then the one-hot subtraction and each model's scale "
                         "in one pass")


OPS = [
    OpDef(name="StackedGemm", shape=_sgemm_shape, kernel=_SGEMM[0], grad=_g_sgemm,
          flops=_sgemm_flops,
          workspace=_SGEMM[1], variants=SGEMM_VARIANTS, num_inputs=(2, 3),
          attrs={"transB": 0, "model_axis": 0}, stacking=ALREADY_STACKED,
          onnx=ENGINE_INTERNAL,
          doc="per-model dense layer of a stack: Y[:, k] = A_k @ W[k] + b[k]"),
    OpDef(name="StackedGemmGradInput", shape=_grad_input_shape, kernel=_GRAD_INPUT[0],
          flops=_grad_input_flops,
          grad=FIRST_ORDER_ONLY, workspace=_GRAD_INPUT[1], variants=GRAD_INPUT_VARIANTS,
          num_inputs=(2, 2),
          attrs={"transB": 0, "shared": 0, "model_axis": 0}, stacking=MADE_AFTER_STACKING,
          onnx=ENGINE_INTERNAL,
          doc="internal: StackedGemm's input gradient (summed over models if shared)"),
    OpDef(name="StackedGemmGradWeight", shape=_grad_weight_shape, kernel=_GRAD_WEIGHT[0],
          flops=_grad_weight_flops,
          grad=FIRST_ORDER_ONLY, workspace=_GRAD_WEIGHT[1], variants=GRAD_WEIGHT_VARIANTS,
          num_inputs=(2, 2), attrs={"transB": 0, "model_axis": 0},
          stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: StackedGemm's weight gradient"),
    OpDef(name="StackedSoftmaxCrossEntropyLoss", shape=_ssce_shape,
          flops=_ssce_flops,
          kernel=jit.by_size("StackedSoftmaxCrossEntropyLoss", SSCE), variants=SSCE,
          grad=_g_ssce,
          workspace=_ssce_ws, num_inputs=(2, 2), num_outputs=2, attrs={"reduction": "mean"},
          stacking=ALREADY_STACKED, onnx=ENGINE_INTERNAL,
          doc="softmax cross-entropy per model of a stack: scores [b, K, C] -> losses [K]"),
    OpDef(name="StackedSoftmaxCrossEntropyLossGrad", shape=_ssce_grad_shape,
          flops=_ssce_grad_flops,
          kernel=jit.by_size("StackedSoftmaxCrossEntropyLossGrad", SSCE_GRAD),
          variants=SSCE_GRAD,
          grad=FIRST_ORDER_ONLY, workspace=_ssce_grad_ws, num_inputs=(3, 3),
          attrs={"reduction": "mean"}, stacking=MADE_AFTER_STACKING, onnx=ENGINE_INTERNAL,
          doc="internal: its gradient"),
]
