"""Every combination of finite parameters, in a random order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from explore.ranges import Choice, IntRange, Range
from explore.samplers._base import BaseSampler, SamplerArgs, register

MAX_POINTS = 10**6  # search_spaces/README.md, "Limits": a grid is listed in memory


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

    def blind(self, args: SamplerArgs) -> int | None:
        return None  # the points, in an order of the seed's

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        bad = [n for n, p in params.items() if isinstance(p, Range) and p.values() is None]
        if bad:
            raise ValueError(f"a grid needs finite parameters: {', '.join(bad)} "
                             "are continuous (give them a choice: list)")
        points = grid_points(params)
        if points > MAX_POINTS:
            raise ValueError(f"a grid of {_shown(points)} points is more than the "
                             f"{MAX_POINTS:,} a grid may have (Optuna lists them all); "
                             "narrow the ranges, give them a step, or use another sampler")


def grid_points(params: Mapping[str, Any]) -> int:
    """The number of points :func:`grid_space` would have, counted without listing any
    value (a product of the values' counts: exact, and cheap however large).

    >>> from explore.ranges import IntRange
    >>> grid_points({"depth": 2, "width": IntRange.model_validate(
    ...     {"int": [1, 1048576], "per_layer": True})})
    1099511627776
    """
    depth = params["depth"]
    if isinstance(depth, IntRange):
        layers = depth.bounds[1]
    elif isinstance(depth, Choice):
        layers = max(int(d) for d in depth.options)
    else:
        layers = int(depth)
    total = 1
    for p in params.values():
        n = p.count() if isinstance(p, Range) else None
        if n is not None:
            total *= n ** (layers if p.per_layer else 1)
    return total


def _shown(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"
