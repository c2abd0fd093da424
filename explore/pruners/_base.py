"""What a pruner is, and the registry of pruners by name.

A pruner plugin makes the Optuna pruner of ``pruner: name`` (for one objective: a
study of several objectives never prunes).  It lives in the scheduler's process, on the
in-memory working copy of the study.  Pruners that decide at rungs (successive halving,
Hyperband) let the scheduler pause a trial instead of pruning it (:mod:`explore.rungs`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import optuna

from explore.registry import Registry


@dataclass(frozen=True)
class PrunerArgs:
    """What a pruner may read of the space."""

    warmup_rounds: int  # pruner.warmup_rounds: rounds before any pruning
    rounds: int  # budget.rounds: the most a trial runs


class BasePruner(ABC):
    """A pruner by name (``pruner: name``)."""

    @abstractmethod
    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        """A new Optuna pruner (one per study)."""


PRUNERS: Registry[BasePruner] = Registry("pruner")
register = PRUNERS.register
get = PRUNERS.get
