"""Objective metrics by name: ``get("accuracy").value(measured, heap_bytes)``.

Add one with a module that subclasses :class:`BaseMetric` and registers it
(``@register("name")``); ``objectives: [{metric: name}]`` is accepted as soon as the
module is imported (the built-in ones are imported here).  Workers compute every
metric that applies to the task after each round (:meth:`BaseMetric.compute`); the
scheduler scores each trial with ``value`` and reports it to the pruner after every
round when ``per_round``.

>>> get("loss").direction, get("planned_bytes").value({}, 1024)
('minimize', 1024.0)
>>> reported("regression", 0)
('loss', 'rmse', 'mae', 'r2')
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.metrics import _accuracy  # noqa: F401
from explore.metrics import _loss  # noqa: F401
from explore.metrics import _f1  # noqa: F401
from explore.metrics import _roc_auc  # noqa: F401
from explore.metrics import _regression  # noqa: F401
from explore.metrics import _planned_bytes  # noqa: F401
from explore.metrics import _train_seconds  # noqa: F401
# isort: on
from explore.metrics._accuracy import Accuracy
from explore.metrics._base import METRICS, BaseMetric, get, register
from explore.metrics._loss import Loss
from explore.metrics._planned_bytes import PlannedBytes
from explore.metrics.evaluation import Evaluation
from explore.registry import import_plugins

names = METRICS.names


def reported(task: str, classes: int) -> tuple[str, ...]:
    """The metrics a worker measures after each round for a data set of ``task`` with
    ``classes`` classes: every registered one that reads the eval path and applies."""
    return tuple(n for n, m in METRICS.items() if m.needs and m.applies(task, classes))


# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["METRICS", "Accuracy", "BaseMetric", "Evaluation", "Loss", "PlannedBytes", "get",
           "names", "register", "reported"]
