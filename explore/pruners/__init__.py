"""Pruners by name: ``get("median").create(args)``.

Add one with a module that subclasses :class:`BasePruner` and registers it
(``@register("name")``); ``pruner: name`` is accepted as soon as the module is imported
(the built-in ones are imported here).
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.pruners import _none  # noqa: F401
from explore.pruners import _median  # noqa: F401
from explore.pruners import _successive_halving  # noqa: F401
from explore.pruners import _hyperband  # noqa: F401
# isort: on
from explore.pruners._base import PRUNERS, BasePruner, PrunerArgs, get, register
from explore.pruners._hyperband import Hyperband
from explore.pruners._median import Median
from explore.pruners._none import NoPruning
from explore.pruners._successive_halving import SuccessiveHalving
from explore.registry import import_plugins

names = PRUNERS.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["PRUNERS", "BasePruner", "Hyperband", "Median", "NoPruning", "PrunerArgs",
           "SuccessiveHalving", "get", "names", "register"]
