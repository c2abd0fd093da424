"""ROC AUC (maximised) of a two-class classification: how well the probability of the
second class ranks the positive rows above the negative ones, from the eval path's
``positive_score`` of every validation row."""

from __future__ import annotations

from explore.metrics._base import BaseMetric, register
from explore.metrics.evaluation import Evaluation, roc_auc


@register("roc_auc")
class RocAuc(BaseMetric):
    direction = "maximize"
    tasks = ("classification",)
    needs = ("positive_score",)

    def applies(self, task: str, classes: int) -> bool:
        return task == "classification" and classes == 2

    def compute(self, ev: Evaluation) -> float:
        assert ev.labels is not None
        return roc_auc(ev.per_row["positive_score"], ev.labels == 1)
