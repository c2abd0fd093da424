"""Metric statistics: per-batch sums a caller adds over evaluation batches and turns
into a metric on the host (none of them are ONNX ops, none is differentiable).

- ``RegressionSums(prediction, target) -> [4]``: ``[sum (p - t)^2, sum |p - t|,
  sum t, sum t^2]`` over every element: with ``n`` elements in all, ``rmse =
  sqrt(s0 / n)``, ``mae = s1 / n`` and ``r2 = 1 - s0 / (s3 - s2^2 / n)``.
- ``ClassCounts(scores [b, C], labels [b]) -> [3, C]``: per class the true positives
  (argmax == label == c), the predicted count (argmax == c) and the true count
  (label == c); macro F1 is the mean over classes with ``pred + true > 0`` of
  ``2 tp / (pred + true)``.
- ``PositiveScore(scores [b, 2]) -> [b]``: the softmax probability of class 1, for a
  ROC AUC on the host.

They are sums, not means, so the last, smaller mini-batch needs nothing special: the
VM binds it to prefixes of the same buffers (:mod:`engine.runtime.vm`), so a kernel
sees ``rows`` rows and sums exactly those.  The per-class counts are made with the
flat indices ``i * C + k`` of :func:`~engine.ops.loss.row_index_step` and
``put``/``take`` into a one-hot scratch: ``bincount`` and broadcast comparisons would
allocate in a step.
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.errors import ShapeError
from engine.graph import TensorDesc
from engine.ops._base import (
    NON_DIFFERENTIABLE_METRIC,
    NOT_STACKED,
    KernelArgs,
    OpDef,
    Step,
    need_float,
    per_input,
    per_output,
    same_dtype,
)
from engine.ops._onnx import NOT_IN_ONNX
from engine.ops.loss import check_labels, row_index_step, take_rows

# -- RegressionSums --------------------------------------------------------------------


def _regression_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    dt = same_dtype(ins, "RegressionSums prediction and target")
    need_float(ins[0], "RegressionSums prediction")
    if ins[0].shape != ins[1].shape:
        raise ShapeError(f"RegressionSums: prediction {ins[0].shape} and target "
                         f"{ins[1].shape} differ")
    return [TensorDesc(dt, (4,))]


def _regression_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict,
                   device: str) -> int:
    return ins[0].nbytes()  # one scratch of the prediction's shape


def _regression(k: KernelArgs) -> Step:
    """``[sum (p - t)^2, sum |p - t|, sum t, sum t^2]`` over every element, in the
    inputs' float type."""
    xp, (p, t), y = k.xp, k.ins, k.outs[0]
    d = k.scratch(0, p.shape, p.dtype)
    sq, ab, st, st2 = (y[i:i + 1].reshape(()) for i in range(4))  # 0-d views

    def step() -> None:
        xp.subtract(p, t, out=d)
        xp.abs(d, out=d)
        xp.sum(d, out=ab)
        xp.multiply(d, d, out=d)
        xp.sum(d, out=sq)
        xp.sum(t, out=st)
        xp.multiply(t, t, out=d)
        xp.sum(d, out=st2)

    return step


# -- ClassCounts -----------------------------------------------------------------------


def _counts_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    scores = ins[0]
    need_float(scores, "ClassCounts scores")
    if len(scores.shape) != 2:
        raise ShapeError(f"ClassCounts: scores must be [batch, classes], got {scores.shape}")
    check_labels(ins[1], scores.shape[:1], scores.shape, "ClassCounts")
    return [TensorDesc(scores.dtype, (3, scores.shape[1]))]


def _counts_flops(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict[str, Any]) -> int:
    """The arg-max, 1 per score; the three counts, 1 per row each."""
    return ins[0].numel() + 3 * ins[0].shape[0]


def _counts_layout(rows: int, classes: int, labels: Any, scores: Any
                   ) -> tuple[int, int, int, int, int]:
    """Byte offsets of the scratch: argmax, its flat indices, the labels' flat
    indices, a per-row float, the one-hot [rows, C]; and the total."""
    lab = labels.itemsize
    fl = scores.itemsize
    arg = 0
    pred_idx = arg + align_up(rows * 8)
    lab_idx = pred_idx + align_up(rows * 8)
    per_row = lab_idx + align_up(rows * lab)
    onehot = per_row + align_up(rows * fl)
    return pred_idx, lab_idx, per_row, onehot, onehot + rows * classes * fl


def _counts_ws(ins: list[TensorDesc], outs: list[TensorDesc], attrs: dict, device: str) -> int:
    rows, classes = ins[0].shape
    return _counts_layout(rows, classes, ins[1].dtype, ins[0].dtype)[-1]


def _counts(k: KernelArgs) -> Step:
    """Row 0: per class the rows whose argmax is the label and the class; row 1: the
    rows whose argmax is the class (the first maximum, as numpy's argmax); row 2: the
    rows labelled with the class.  Labels outside [0, C) are an InputError."""
    xp, (x, labels), y = k.xp, k.ins, k.outs[0]
    b, c = x.shape
    pred_o, lab_o, row_o, hot_o, _ = _counts_layout(b, c, labels.dtype, x.dtype)
    arg = k.scratch(0, (b,), "int64")
    pred_idx = k.scratch(pred_o, (b,), "int64")
    lab_idx = k.scratch(lab_o, (b,), labels.dtype)
    per_row = k.scratch(row_o, (b,), x.dtype)
    onehot = k.scratch(hot_o, (b, c), x.dtype)
    flat = onehot.reshape(-1)
    make_pred = row_index_step(xp, pred_idx, arg, c, check=False)
    make_lab = row_index_step(xp, lab_idx, labels, c)
    tp, pred, true = y[0], y[1], y[2]

    def step() -> None:
        make_lab()  # checks the labels first
        xp.argmax(x, axis=1, out=arg)
        make_pred()
        per_row.fill(1)
        onehot.fill(0)
        xp.put(flat, pred_idx, per_row, mode="clip")  # one-hot of the predictions
        xp.sum(onehot, axis=0, out=pred)
        take_rows(xp, flat, lab_idx, per_row)  # 1 where the prediction is the label
        onehot.fill(0)
        xp.put(flat, lab_idx, per_row, mode="clip")
        xp.sum(onehot, axis=0, out=tp)
        per_row.fill(1)
        xp.put(flat, lab_idx, per_row, mode="clip")  # one-hot of the labels
        xp.sum(onehot, axis=0, out=true)

    return step


# -- PositiveScore ---------------------------------------------------------------------


def _positive_shape(ins: list[TensorDesc], attrs: dict[str, Any]) -> list[TensorDesc]:
    scores = ins[0]
    need_float(scores, "PositiveScore scores")
    if len(scores.shape) != 2 or scores.shape[1] != 2:
        raise ShapeError(f"PositiveScore: scores must be [batch, 2], got {scores.shape}")
    return [TensorDesc(scores.dtype, scores.shape[:1])]


def _positive(k: KernelArgs) -> Step:
    """softmax(scores)[:, 1] = sigmoid(z) with z = s1 - s0, as exp(-log(1 + exp(-z)))
    (``logaddexp``): no overflow, and a small probability keeps its relative precision
    (``0.5 (1 + tanh(z / 2))`` rounds every z below about -17 to 0 in float32, which
    would tie the most confident negatives of a ROC curve)."""
    xp, x, y = k.xp, k.ins[0], k.outs[0]
    s0, s1 = x[:, 0], x[:, 1]

    def step() -> None:
        xp.subtract(s0, s1, out=y)  # -z
        xp.logaddexp(y, 0.0, out=y)  # log(1 + exp(-z))
        xp.negative(y, out=y)
        xp.exp(y, out=y)

    return step


OPS = [
    OpDef(name="RegressionSums", shape=_regression_shape, kernel=_regression,
          flops=per_input(8),
          grad=NON_DIFFERENTIABLE_METRIC, workspace=_regression_ws, num_inputs=(2, 2),
          stacking=NOT_STACKED, onnx=NOT_IN_ONNX,
          doc="[sum (p - t)^2, sum |p - t|, sum t, sum t^2] over every element of "
              "prediction p and target t (sums, to add over batches)"),
    OpDef(name="ClassCounts", shape=_counts_shape, kernel=_counts,
          flops=_counts_flops,
          grad=NON_DIFFERENTIABLE_METRIC, workspace=_counts_ws, num_inputs=(2, 2),
          stacking=NOT_STACKED, onnx=NOT_IN_ONNX,
          doc="[3, C]: per class the true positives (argmax == label == c), the "
              "predicted count (argmax == c) and the true count (label == c), summed "
              "over the batch"),
    OpDef(name="PositiveScore", shape=_positive_shape, kernel=_positive,
          flops=per_output(2),
          grad=NON_DIFFERENTIABLE_METRIC, num_inputs=(1, 1), stacking=NOT_STACKED,
          onnx=NOT_IN_ONNX,
          doc="[b]: softmax(scores)[:, 1] = sigmoid(s1 - s0) of scores [b, 2], computed "
              "without overflow"),
]
