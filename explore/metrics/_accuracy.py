"""Validation accuracy (maximised): the fraction of rows whose top class is the label."""

from __future__ import annotations

from explore.metrics._base import BaseMetric, register
from explore.metrics.evaluation import Evaluation


@register("accuracy")
class Accuracy(BaseMetric):
    direction = "maximize"
    tasks = ("classification",)
    needs = ("accuracy",)

    def compute(self, ev: Evaluation) -> float:
        return float(ev.means["accuracy"])
