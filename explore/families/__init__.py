"""Model families by name: ``get("mlp").build(params, data)``; one place for every way
a trial's parameters become a network.

- the built-in families ``mlp``, ``cnn`` and ``resnet`` (:mod:`explore.families.layers`
  holds what they share), the sequence families ``transformer`` and ``conv1d``
  (:mod:`explore.families.sequences`) and ``onnx``, a model read from a file;
- :mod:`explore.families.builder`, the user's own Python (``model.builder``), a function
  of the trial and of the data's facts (:class:`DataInfo`);
- :mod:`explore.families.tasks`, the conventions every model follows for its task.

Add a family with a module that subclasses :class:`BaseFamily` (or
:class:`~explore.families.layers.ModuleFamily`, for an :mod:`engine.nn` network) and
registers it (``@register("name")``); ``model.family: name`` is accepted as soon as it is
imported (the built-in ones are imported here).

>>> names()
('mlp', 'cnn', 'transformer', 'conv1d', 'onnx', 'resnet')
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.families import _mlp  # noqa: F401
from explore.families import _cnn  # noqa: F401
from explore.families import _transformer  # noqa: F401
from explore.families import _conv1d  # noqa: F401
# isort: on
from explore.families._base import (
    FAMILIES,
    FAMILY_ONLY_KEYS,
    AtKey,
    BaseFamily,
    BuildError,
    DataInfo,
    DataShape,
    Shape,
    get,
    register,
)
from explore.families._cnn import CnnFamily
from explore.families._mlp import MlpFamily
from explore.families._onnx import Onnx, check_onnx_key
from explore.families.builder import BuilderError, OutputMismatch
from explore.families.layers import ModuleFamily
from explore.registry import import_plugins

names = FAMILIES.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["FAMILIES", "FAMILY_ONLY_KEYS", "AtKey", "BaseFamily", "BuildError", "BuilderError",
           "CnnFamily", "DataInfo", "DataShape", "MlpFamily", "ModuleFamily", "Onnx",
           "OutputMismatch", "Shape", "check_onnx_key", "get", "names", "register"]
