"""Regression metrics from the summed ``regression_sums`` (squared error, absolute
error, target, squared target, on the standardized target): ``rmse`` and ``mae`` in the
target's units (minimised), ``r2`` (maximised; 1 - SSE / SST, scikit-learn's
``r2_score``)."""

from __future__ import annotations

import math

from explore.metrics._base import BaseMetric, register
from explore.metrics.evaluation import Evaluation


@register("rmse")
class Rmse(BaseMetric):
    direction = "minimize"
    tasks = ("regression",)
    needs = ("regression_sums",)

    def compute(self, ev: Evaluation) -> float:
        sse = float(ev.sums["regression_sums"][0])
        return math.sqrt(sse / max(ev.rows, 1)) * ev.target_std


@register("mae")
class Mae(BaseMetric):
    direction = "minimize"
    tasks = ("regression",)
    needs = ("regression_sums",)

    def compute(self, ev: Evaluation) -> float:
        return float(ev.sums["regression_sums"][1]) / max(ev.rows, 1) * ev.target_std


@register("r2")
class R2(BaseMetric):
    direction = "maximize"
    tasks = ("regression",)
    needs = ("regression_sums",)

    def compute(self, ev: Evaluation) -> float:
        sse, _, st, stt = (float(v) for v in ev.sums["regression_sums"])
        n = max(ev.rows, 1)
        sst = stt - st * st / n
        if sst <= 0:
            return float("nan") if sse > 0 else 1.0
        return 1.0 - sse / sst
