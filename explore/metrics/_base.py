"""What an objective's metric is, and the registry of metrics by name.

A metric has two halves.  In the worker, after each round, :meth:`BaseMetric.compute`
turns what the eval path measured over the validation split (an
:class:`~explore.metrics.evaluation.Evaluation`: per-batch means such as ``accuracy``,
summed statistics such as ``class_counts``, per-row scores) into one float; every
metric of the task is computed and sent as a plain float, named by the metric.  In
the scheduler, :meth:`BaseMetric.value` reads the objective's value from those floats
and the candidate's planned heap.  What a metric reads from the eval path is an op
there (:mod:`explore.families`), so it is sized and planned like the model.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from explore.registry import C, Registry
from explore.suggest import did_you_mean

if TYPE_CHECKING:
    from explore.metrics.evaluation import Evaluation

Task = Literal["classification", "regression"]


class BaseMetric(ABC):
    """An objective's metric (``objectives: [{metric: name}]``)."""

    name: ClassVar[str] = ""  # set by register()
    direction: ClassVar[Literal["maximize", "minimize"]]  # the default direction
    # Whether it changes from round to round, so that a pruner may judge it after each
    # (a model's planned bytes do not).
    per_round: ClassVar[bool] = True
    # The tasks it means something for; None: every task.
    tasks: ClassVar[tuple[Task, ...] | None] = None
    # The eval path's outputs it reads (see explore.metrics.evaluation.OUTPUTS); empty
    # for a metric the scheduler knows without a validation pass.
    needs: ClassVar[tuple[str, ...]] = ()

    def applies(self, task: str, classes: int) -> bool:
        """Whether it can be measured on a data set of ``task`` with ``classes``."""
        return self.tasks is None or task in self.tasks

    def compute(self, ev: Evaluation) -> float:
        """The metric from a validation pass (in the worker); only for metrics that
        read the eval path (``needs``)."""
        raise NotImplementedError(f"metric {self.name!r} is not measured on the eval path")

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        """The objective's value from what the worker sent after a round (the metrics
        by name, ``train_loss`` and ``train_seconds``) and the candidate's planned heap."""
        return float(measured[self.name])


# Other names for our metrics (scikit-learn's, habit's) that no spelling distance finds.
SYNONYMS = {"auc": "roc_auc", "acc": "accuracy", "f1_score": "f1", "r2_score": "r2",
            "mse": "rmse", "mean_squared_error": "rmse", "mean_absolute_error": "mae",
            "error": "loss", "memory": "planned_bytes", "bytes": "planned_bytes",
            "time": "train_seconds", "seconds": "train_seconds"}


class _Registry(Registry[BaseMetric]):
    """Registers a metric under its name and tells the class that name; an unknown
    name's message says which one was likely meant."""

    def check(self, value: Any) -> str:
        """``value`` if it is a metric's name, else a ValueError listing the names, with
        the close ones (or a synonym's) first.

        >>> METRICS.check("auc")
        Traceback (most recent call last):
        ...
        ValueError: Input should be 'accuracy', ...; did you mean 'roc_auc'?
        """
        try:
            return super().check(value)
        except ValueError as e:
            raise ValueError(f"{e}{did_you_mean(value, self.names(), SYNONYMS)}") from None

    def register(self, name: str) -> Callable[[C], C]:
        add = super().register(name)

        def named(cls: C) -> C:
            cls.name = name  # type: ignore[attr-defined]
            return add(cls)

        return named


METRICS: Registry[BaseMetric] = _Registry("metric")
register = METRICS.register
get = METRICS.get
