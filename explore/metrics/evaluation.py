"""What a validation pass measured, and the metrics computed from it in the worker.

The eval path of a model (:mod:`explore.families`) ends in ops whose results the
worker reads after each validation batch, in three kinds:

- means (``accuracy``, ``eval_loss``): a batch's mean, averaged over the batches
  weighted by their rows;
- sums (``class_counts``, ``regression_sums``): statistics added over the batches,
  from which a metric that is not a mean of per-row values (macro F1, R²) is exact;
- per-row values (``positive_score``): written into a host array of one value per
  validation row, for ROC AUC, which ranks all of them.

>>> import numpy as np
>>> ev = Evaluation(rows=4, task="regression", means={},
...                 sums={"regression_sums": np.array([1.0, 2.0, 0.0, 4.0])})
>>> float(ev.sums["regression_sums"][0])
1.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from explore.metrics._base import METRICS

MEANS = ("accuracy", "eval_loss")
SUMS = ("class_counts", "regression_sums")
ROWS = ("positive_score",)
OUTPUTS = MEANS + SUMS + ROWS


@dataclass
class Evaluation:
    """One validation pass: ``rows`` rows of a ``task``; the regression target was
    standardized with ``target_std`` (the metrics in the target's units multiply by
    it).  ``labels`` are the rows' labels where a per-row output was collected."""

    rows: int
    task: str
    means: Mapping[str, float] = field(default_factory=dict)
    sums: Mapping[str, np.ndarray] = field(default_factory=dict)
    per_row: Mapping[str, np.ndarray] = field(default_factory=dict)
    labels: np.ndarray | None = None
    target_std: float = 1.0


def outputs_needed(names: Iterable[str]) -> tuple[str, ...]:
    """The eval-path outputs the metrics ``names`` read, in :data:`OUTPUTS` order."""
    need = {o for n in names for o in METRICS.get(n).needs}
    return tuple(o for o in OUTPUTS if o in need)


def compute_all(names: Iterable[str], ev: Evaluation) -> dict[str, float]:
    """Every metric of ``names`` from ``ev``: ``{name: value}``."""
    return {n: float(METRICS.get(n).compute(ev)) for n in names}


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for the rows where ``positive``:
    the Mann-Whitney statistic, ties counted half (as scikit-learn's roc_auc_score).
    NaN when one class is absent.

    >>> roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    0.75
    """
    pos = np.asarray(positive).astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    s = np.sort(np.asarray(scores, np.float64), kind="mergesort")
    # a score's rank (1-based), averaged over the scores equal to it
    rank = (np.searchsorted(s, scores, "left") + np.searchsorted(s, scores, "right") + 1) / 2
    return float((rank[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
