"""Multivariate, grouped TPE (the default)."""

from __future__ import annotations

import warnings

import optuna

from explore.samplers._base import BaseSampler, SamplerArgs, register

STARTUP = 10  # random draws before TPE models the results (Optuna's default)


@register("tpe")
class Tpe(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():  # multivariate TPE is "experimental" in name only
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=args.seed,
                                              n_startup_trials=self.blind(args),
                                              multivariate=True, group=True)

    def blind(self, args: SamplerArgs) -> int:
        return STARTUP if args.startup_trials is None else args.startup_trials
