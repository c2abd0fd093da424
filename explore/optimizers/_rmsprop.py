"""The engine's RMSProp under the name ``rmsprop``."""

from __future__ import annotations

from engine import Optimizer, RMSProp
from explore.optimizers._base import BaseOptimizer, register


@register("rmsprop")
class RmsPropOptimizer(BaseOptimizer):
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return RMSProp(lr=lr, momentum=momentum)
