"""Macro F1 (maximised): the mean over classes of 2·TP / (predicted + true), over the
classes that occur among the labels or the predictions (scikit-learn's
``f1_score(average="macro")``), from the summed ``class_counts``."""

from __future__ import annotations

import numpy as np

from explore.metrics._base import BaseMetric, register
from explore.metrics.evaluation import Evaluation


def macro_f1(counts: np.ndarray) -> float:
    """Macro F1 from ``[3, C]`` counts (true positives, predicted, true per class).

    >>> macro_f1(np.array([[1, 1], [2, 1], [1, 2]]))
    0.6666666666666666
    """
    tp, pred, true = (np.asarray(r, np.float64) for r in counts)
    seen = (pred + true) > 0
    if not seen.any():
        return float("nan")
    return float(np.mean(2 * tp[seen] / (pred[seen] + true[seen])))


@register("f1")
class F1(BaseMetric):
    direction = "maximize"
    tasks = ("classification",)
    needs = ("class_counts",)

    def compute(self, ev: Evaluation) -> float:
        return macro_f1(ev.sums["class_counts"])
