"""Hyperband: successive-halving brackets of several minimum resources."""

from __future__ import annotations

import optuna

from explore.pruners._base import BasePruner, PrunerArgs, register


@register("hyperband")
class Hyperband(BasePruner):
    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        return optuna.pruners.HyperbandPruner(min_resource=max(1, args.warmup_rounds),
                                              max_resource=args.rounds)
