"""The engine's AdamW under the name ``adamw``."""

from __future__ import annotations

from engine import AdamW, Optimizer
from explore.optimizers._base import BaseOptimizer, register


@register("adamw")
class AdamWOptimizer(BaseOptimizer):
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return AdamW(lr=lr, weight_decay=weight_decay)
