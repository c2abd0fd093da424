"""Validation cross-entropy (minimised): the eval path's loss."""

from __future__ import annotations

from collections.abc import Mapping

from explore.metrics._base import BaseMetric, register


@register("loss")
class Loss(BaseMetric):
    direction = "minimize"
    eval_loss = True

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        return measured["eval_loss"]
