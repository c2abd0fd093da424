"""Independent uniform (or log-uniform) draws."""

from __future__ import annotations

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register


@register("random")
class Random(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=args.seed)

    def blind(self, args: SamplerArgs) -> int | None:
        return None
