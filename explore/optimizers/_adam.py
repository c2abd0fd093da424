"""The engine's Adam under the name ``adam``."""

from __future__ import annotations

from engine import Adam, Optimizer
from explore.optimizers._base import BaseOptimizer, register


@register("adam")
class AdamOptimizer(BaseOptimizer):
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return Adam(lr=lr, weight_decay=weight_decay)
