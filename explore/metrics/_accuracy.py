"""Validation accuracy (maximised)."""

from __future__ import annotations

from collections.abc import Mapping

from explore.metrics._base import BaseMetric, register


@register("accuracy")
class Accuracy(BaseMetric):
    direction = "maximize"

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        return measured["accuracy"]
