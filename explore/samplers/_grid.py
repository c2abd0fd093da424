"""Every combination of finite parameters, in a random order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from explore.ranges import Choice, IntRange, Range
from explore.samplers._base import BaseSampler, SamplerArgs, register


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid, for ask/tell: its ``after_trial`` stops the study when the grid
    is exhausted, which only an objective function may do; the scheduler counts the
    trials itself (and Optuna's grid starts over once exhausted)."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def grid_space(params: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Optuna's grid: each searched parameter's finite values (per layer too)."""
    out: dict[str, list[Any]] = {}
    depth = params["depth"]
    depths = depth.values() if isinstance(depth, IntRange | Choice) else [depth]
    for name, p in params.items():
        values = p.values() if hasattr(p, "values") else None
        if values is None:
            continue
        if getattr(p, "per_layer", False):
            for i in range(max(int(d) for d in depths or [1])):
                out[f"{name}_{i}"] = values
        else:
            out[name] = values
    return out


@register("grid")
class Grid(BaseSampler):
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        return _Grid(grid_space(args.params), seed=args.seed)

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        bad = [n for n, p in params.items() if isinstance(p, Range) and p.values() is None]
        if bad:
            raise ValueError(f"a grid needs finite parameters: {', '.join(bad)} "
                             "are continuous (give them a choice: list)")
