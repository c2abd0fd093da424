"""Prune a trial below the median of earlier trials at the same round."""

from __future__ import annotations

import optuna

from explore.pruners._base import BasePruner, PrunerArgs, register


@register("median")
class Median(BasePruner):
    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=args.warmup_rounds)
