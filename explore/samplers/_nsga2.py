"""NSGA-II: several objectives (a Pareto front)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register


@register("nsga2")
class Nsga2(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=args.seed)

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        if objectives == 1:
            raise ValueError("nsga2 is for several objectives; add one or pick tpe")
