"""Multivariate, grouped TPE (the default)."""

from __future__ import annotations

import warnings

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register


@register("tpe")
class Tpe(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():  # multivariate TPE is "experimental" in name only
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=args.seed,
                                              n_startup_trials=args.startup_trials or 10,
                                              multivariate=True, group=True)
