"""Asynchronous successive halving: at each rung, keep the top 1/eta."""

from __future__ import annotations

import optuna

from explore.pruners._base import BasePruner, PrunerArgs, register


@register("successive_halving")
class SuccessiveHalving(BasePruner):
    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, args.warmup_rounds))
