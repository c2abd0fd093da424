"""CMA-ES: one objective, continuous parameters (categorical ones fall back to
independent sampling)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register


@register("cmaes")
class CmaEs(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=args.seed,
                                            n_startup_trials=self.blind(args))

    def blind(self, args: SamplerArgs) -> int:
        return 1 if args.startup_trials is None else args.startup_trials

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        if objectives > 1:
            raise ValueError("cmaes optimises one objective; use nsga2 (or tpe, random) for "
                             "several")
