"""The engine's Adagrad under the name ``adagrad``."""

from __future__ import annotations

from engine import Adagrad, Optimizer
from explore.optimizers._base import BaseOptimizer, register


@register("adagrad")
class AdagradOptimizer(BaseOptimizer):
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return Adagrad(lr=lr)
