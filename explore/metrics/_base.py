"""What an objective's metric is, and the registry of metrics by name.

A metric turns what a worker measured on the validation split after a round (the
``metrics`` dict it sends: ``accuracy``, ``eval_loss``, ``loss``) and the candidate's
planned heap into the value Optuna optimises.  Metrics are evaluated in the
scheduler's process; workers send plain floats.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, Literal

from explore.registry import Registry


class BaseMetric(ABC):
    """An objective's metric (``objectives: [{metric: name}]``)."""

    direction: ClassVar[Literal["maximize", "minimize"]]  # the default direction
    # Whether it changes from round to round, so that a pruner may judge it after each
    # (a model's planned bytes do not).
    per_round: ClassVar[bool] = True
    # Whether it reads the eval path's loss, which is then compiled into the program.
    eval_loss: ClassVar[bool] = False

    @abstractmethod
    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        """The objective's value from a round's validation ``measured`` and the
        candidate's planned heap."""


METRICS: Registry[BaseMetric] = Registry("metric")
register = METRICS.register
get = METRICS.get
