"""Optimizers by name: ``build_optimizer(params)``.

Add one with a module that subclasses :class:`BaseOptimizer` and registers it
(``@register("name")``); ``training.optimizer: name`` builds it as soon as the module
is imported (the built-in ones are imported here).

>>> type(build_optimizer({"optimizer": "SGD", "lr": 0.1, "momentum": 0.9})).__name__
'SGD'
"""

# Registration order is the order error messages list the names in.
# isort: off
from explore.optimizers import _sgd  # noqa: F401
from explore.optimizers import _adam  # noqa: F401
from explore.optimizers import _adamw  # noqa: F401
from explore.optimizers import _rmsprop  # noqa: F401
from explore.optimizers import _adagrad  # noqa: F401
# isort: on
from explore.optimizers._adagrad import AdagradOptimizer
from explore.optimizers._adam import AdamOptimizer
from explore.optimizers._adamw import AdamWOptimizer
from explore.optimizers._base import OPTIMIZERS, BaseOptimizer, build_optimizer, get, register
from explore.optimizers._rmsprop import RmsPropOptimizer
from explore.optimizers._sgd import SgdOptimizer
from explore.registry import import_plugins

names = OPTIMIZERS.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["OPTIMIZERS", "AdagradOptimizer", "AdamOptimizer", "AdamWOptimizer", "BaseOptimizer",
           "RmsPropOptimizer", "SgdOptimizer", "build_optimizer", "get", "names", "register"]
