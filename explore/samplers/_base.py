"""What a sampler is, and the registry of samplers by name.

A sampler plugin makes the Optuna sampler of ``sampler: name`` and may refuse spaces it
cannot search (:meth:`BaseSampler.check`, run by the schema, so the error names the
file).  The Optuna sampler lives in the scheduler's process, on its in-memory working
copy of the study; it never crosses to a worker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from explore.registry import Registry


@dataclass(frozen=True)
class SamplerArgs:
    """What a sampler may read of the space."""

    seed: int  # sampler.seed, or budget.seed when it has none
    startup_trials: int | None  # sampler.startup_trials (None: the sampler's default)
    objectives: int
    params: Mapping[str, Any]  # the space's parameters (Space.params()): fixed or ranges


class BaseSampler(ABC):
    """A sampler by name (``sampler: name``)."""

    @abstractmethod
    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        """A new Optuna sampler (one per study: samplers keep state)."""

    def blind(self, args: SamplerArgs) -> int | None:
        """How many of a study's first trials it draws without reading any result (None:
        every trial, as a random search does).  A trial numbered below it is drawn the
        same whenever it is asked, so the scheduler may draw those ahead and start the
        cheapest first (:func:`explore.scheduler.core.placing.ahead`).  0 by default: a
        sampler that does not say is taken to read every result."""
        return 0

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:  # noqa: B027
        """Raise ValueError if it cannot search a space with this many objectives and
        these parameters.  Accepts everything by default."""


SAMPLERS: Registry[BaseSampler] = Registry("sampler")
register = SAMPLERS.register
get = SAMPLERS.get
