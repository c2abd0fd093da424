"""Seconds the trial's worker spent training and validating it (minimised): measured,
so it varies with the machine's load; not judged round by round."""

from __future__ import annotations

from explore.metrics._base import BaseMetric, register


@register("train_seconds")
class TrainSeconds(BaseMetric):
    direction = "minimize"
    per_round = False
