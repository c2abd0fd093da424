"""Samplers by name: ``get("tpe").create(args)``.

Add one with a module that subclasses :class:`BaseSampler` and registers it
(``@register("name")``); ``sampler: name`` is accepted as soon as the module is
imported (the built-in ones are imported here).
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.samplers import _tpe  # noqa: F401
from explore.samplers import _random  # noqa: F401
from explore.samplers import _grid  # noqa: F401
from explore.samplers import _cmaes  # noqa: F401
from explore.samplers import _nsga2  # noqa: F401
# isort: on
from explore.registry import import_plugins
from explore.samplers._base import SAMPLERS, BaseSampler, SamplerArgs, get, register
from explore.samplers._cmaes import CmaEs
from explore.samplers._grid import Grid, grid_space
from explore.samplers._nsga2 import Nsga2
from explore.samplers._random import Random
from explore.samplers._tpe import Tpe

names = SAMPLERS.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["SAMPLERS", "BaseSampler", "CmaEs", "Grid", "Nsga2", "Random", "SamplerArgs", "Tpe",
           "get", "grid_space", "names", "register"]
