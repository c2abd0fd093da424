"""No pruning: every trial runs all its rounds."""

from __future__ import annotations

import optuna

from explore.pruners._base import BasePruner, PrunerArgs, register


@register("none")
class NoPruning(BasePruner):
    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()
