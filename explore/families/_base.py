"""What a model family is, and the registry of families by name.

A family turns one candidate's sampled parameters (:func:`explore.sampling.suggest`)
into a :class:`~engine.CalcGraph` for the data set's task, with a ``train`` path (the
loss) and an ``eval`` path whose last layer is ``logits`` (what an exported model
computes) and whose outputs are what the task's metrics read
(:mod:`explore.metrics.evaluation`; ``eval_loss`` when asked for), and says which model
sections it accepts.  Families run in the scheduler's process only: what crosses to a worker
is the compiled program, never the family or its graph.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from engine import CalcGraph
from explore.datasets import BaseDataset
from explore.registry import Registry


class BaseFamily(ABC):
    """A model family (``model.family`` in a search space)."""

    @abstractmethod
    def build(self, params: dict[str, Any], dataset: BaseDataset,
              eval_loss: bool = True) -> CalcGraph:
        """The model of ``params`` for ``dataset`` (raises
        :class:`~explore.builders.BuildError` for parameters that make no model)."""

    def check(self, model: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Raise ValueError if the ``model`` section (name -> fixed value or range, as
        the schema parsed it) does not fit the family (:class:`AtKey` for a problem of
        one key).  Accepts everything by default."""


class AtKey(ValueError):
    """A problem :meth:`BaseFamily.check` finds at one key of the model section: the
    schema reports it at that key's line rather than the section's."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


FAMILIES: Registry[BaseFamily] = Registry("model family")
register = FAMILIES.register
get = FAMILIES.get
