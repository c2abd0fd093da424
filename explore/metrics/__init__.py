"""Objective metrics by name: ``get("accuracy").value(measured, heap_bytes)``.

Add one with a module that subclasses :class:`BaseMetric` and registers it
(``@register("name")``); ``objectives: [{metric: name}]`` is accepted as soon as the
module is imported (the built-in ones are imported here).  The scheduler scores each
trial with ``value`` and reports it to the pruner after every round when ``per_round``.

>>> get("loss").direction, get("planned_bytes").value({}, 1024)
('minimize', 1024.0)
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.metrics import _accuracy  # noqa: F401
from explore.metrics import _loss  # noqa: F401
from explore.metrics import _planned_bytes  # noqa: F401
# isort: on
from explore.metrics._accuracy import Accuracy
from explore.metrics._base import METRICS, BaseMetric, get, register
from explore.metrics._loss import Loss
from explore.metrics._planned_bytes import PlannedBytes
from explore.registry import import_plugins

names = METRICS.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["METRICS", "Accuracy", "BaseMetric", "Loss", "PlannedBytes", "get", "names",
           "register"]
