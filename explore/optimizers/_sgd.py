"""The engine's SGD under the name ``sgd``."""

from __future__ import annotations

from engine import SGD, Optimizer
from explore.optimizers._base import BaseOptimizer, register


@register("sgd")
class SgdOptimizer(BaseOptimizer):
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return SGD(lr=lr, momentum=momentum, weight_decay=weight_decay)
