"""Model families by name: ``get("mlp").build(params, dataset)``.

Add one with a module that subclasses :class:`BaseFamily` and registers it
(``@register("name")``); ``model.family: name`` is accepted as soon as it is imported
(the built-in ones are imported here).
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.families import _mlp  # noqa: F401
from explore.families import _cnn  # noqa: F401
# isort: on
from explore.families._base import FAMILIES, AtKey, BaseFamily, get, register
from explore.families._cnn import Cnn
from explore.families._mlp import Mlp
from explore.families._onnx import Onnx, check_onnx_key
from explore.registry import import_plugins

names = FAMILIES.names

# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["FAMILIES", "AtKey", "BaseFamily", "Cnn", "Mlp", "Onnx", "check_onnx_key", "get",
           "names", "register"]
