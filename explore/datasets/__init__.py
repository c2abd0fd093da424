"""Datasets by name: ``get("mnist").load()``; users' own files and Python data through
:mod:`explore.datasets.table` (``from_file``, ``from_python``).

Add one with a module that subclasses :class:`BaseDataset` and registers it
(``@register("name")``); the search-space schema accepts the name as soon as the module
is imported (the built-in ones are imported here): MNIST, scikit-learn's digits and its
tables iris, wine, breast_cancer (classification) and diabetes (regression), MNIST read
row by row as a sequence (mnist_rows) and the yearly sunspot numbers (sunspots, a time
series).  Sequences of the user's: :mod:`~explore.datasets.series` (windows of a time
series) and :mod:`~explore.datasets.sequences` (token or feature arrays).

>>> get("digits").features, names()
(64, ('mnist', 'digits', 'iris', 'wine', 'breast_cancer', 'diabetes', 'mnist_rows', 'sunspots'))
"""

# Registration order is the order the schema's messages list the names in.
# isort: off
from explore.datasets import _mnist  # noqa: F401
from explore.datasets import _digits  # noqa: F401
from explore.datasets import _tables  # noqa: F401
from explore.datasets import _mnist_rows  # noqa: F401
from explore.datasets import _sunspots  # noqa: F401
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
from explore.datasets._mnist_rows import MnistRows
from explore.datasets._sunspots import Sunspots
from explore.datasets._tables import BundledTable, sklearn_file
from explore.datasets.preprocess import Preprocess
from explore.datasets.quantize import quantize
from explore.datasets.sequence_shape import SequenceShape
from explore.datasets.sequences import SequenceDataset, sequences_from_file
from explore.datasets.series import ForecastError, SeriesDataset, seasonal_naive, series_from_file
from explore.datasets.table import TableDataset, from_file, from_python, resolve
from explore.registry import import_plugins

names = DATASETS.names


def load(name: str) -> LoadedData:
    """The dataset ``name`` (:class:`DataError` listing the available ones if none)."""
    return get(name).load()


# Any other implementation in this folder registers by being here.
import_plugins(__name__, __path__)

__all__ = ["DATASETS", "BaseDataset", "BundledTable", "DataError", "Digits", "ForecastError",
           "LoadedData", "Mnist", "MnistRows", "Preprocess", "SequenceDataset",
           "SequenceShape", "SeriesDataset", "Split", "Sunspots", "TableDataset", "compact",
           "from_file", "from_python", "get", "load", "load_digits", "load_mnist",
           "mnist_path", "names", "quantize", "read_mnist_pickle", "register", "resolve",
           "seasonal_naive", "sequences_from_file", "series_from_file", "sklearn_file"]
