"""NSGA-II: several objectives (a Pareto front)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register

POPULATION = 50  # trials in a generation (Optuna's default)


@register("nsga2")
class Nsga2(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=args.seed, population_size=POPULATION)

    def blind(self, args: SamplerArgs) -> int:
        return POPULATION  # the first generation is drawn at random

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        if objectives == 1:
            raise ValueError("nsga2 is for several objectives; add one or pick tpe")
