"""Validation loss (minimised): the training loss on the eval path (cross-entropy for a
classification; the chosen loss on the standardized target for a regression)."""

from __future__ import annotations

from explore.metrics._base import BaseMetric, register
from explore.metrics.evaluation import Evaluation


@register("loss")
class Loss(BaseMetric):
    direction = "minimize"
    needs = ("eval_loss",)

    def compute(self, ev: Evaluation) -> float:
        return float(ev.means["eval_loss"])
