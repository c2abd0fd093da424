"""The candidate's planned heap in bytes (minimised): known before it runs."""

from __future__ import annotations

from collections.abc import Mapping

from explore.metrics._base import BaseMetric, register


@register("planned_bytes")
class PlannedBytes(BaseMetric):
    direction = "minimize"
    per_round = False

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        return float(heap_bytes)
