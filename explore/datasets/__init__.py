"""Datasets by name: ``get("mnist").load()``; users' own files and Python data through
:mod:`explore.datasets.table` (``from_file``, ``from_python``).

Add one with a module that subclasses :class:`BaseDataset` and registers it
(``@register("name")``); the search-space schema accepts the name as soon as the module
is imported (the built-in ones are imported here): MNIST, scikit-learn's digits and its
tables iris, wine, breast_cancer (classification) and diabetes (regression).

>>> get("digits").features, names()
(64, ('mnist', 'digits', 'iris', 'wine', 'breast_cancer', 'diabetes'))
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.datasets import _mnist  # noqa: F401
from explore.datasets import _digits  # noqa: F401
from explore.datasets import _tables  # noqa: F401
# isort: on
from explore.datasets._base import (
    DATASETS,
    BaseDataset,
    DataError,
    LoadedData,
    Split,
    compact,
    get,
    register,
)
from explore.datasets._digits import Digits, load_digits
from explore.datasets._mnist import Mnist, load_mnist, mnist_path, read_mnist_pickle
from explore.datasets._tables import BundledTable, sklearn_file
from explore.datasets.preprocess import Preprocess
from explore.datasets.quantize import quantize
from explore.datasets.table import TableDataset, from_file, from_python, resolve
from explore.registry import import_plugins

names = DATASETS.names


def load(name: str) -> LoadedData:
    """The dataset ``name`` (:class:`DataError` listing the available ones if none)."""
    return get(name).load()


# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["DATASETS", "BaseDataset", "BundledTable", "DataError", "Digits", "LoadedData",
           "Mnist", "Preprocess", "Split", "TableDataset", "compact", "from_file", "from_python",
           "get", "load", "load_digits", "load_mnist", "mnist_path", "names", "quantize",
           "read_mnist_pickle", "register", "resolve", "sklearn_file"]
