"""What an optimizer is, and the registry of optimizers by name.

An optimizer plugin makes the engine's optimizer (``training.optimizer`` in a search
space) from a candidate's sampled parameters; the engine compiles its update into the
program, so nothing of it crosses to a worker but the compiled program.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from engine import Optimizer
from explore.families import BuildError
from explore.registry import Registry


class BaseOptimizer(ABC):
    """An optimizer by name."""

    @abstractmethod
    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        """The engine's optimizer; an optimizer ignores what it has no use for."""


OPTIMIZERS: Registry[BaseOptimizer] = Registry("optimizer")
register = OPTIMIZERS.register
get = OPTIMIZERS.get


def build_optimizer(params: dict[str, Any]) -> Optimizer:
    """The optimizer of a candidate's ``params`` (``optimizer``, ``lr``, ``momentum``,
    ``weight_decay``); :class:`~explore.families.BuildError` for an unknown name."""
    name = str(params["optimizer"]).lower()
    if name not in OPTIMIZERS:
        raise BuildError(f"unknown optimizer {params['optimizer']!r}; known: "
                         f"{', '.join(OPTIMIZERS.names())}")
    return OPTIMIZERS.get(name).build(float(params["lr"]),
                                      float(params.get("momentum") or 0.0),
                                      float(params.get("weight_decay") or 0.0))
