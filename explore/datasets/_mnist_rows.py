"""MNIST read row by row: ``mnist_rows``, each image a sequence of its 28 pixel rows.

The same file, splits and uint8 pixels as :class:`~explore.datasets.Mnist`; only the
way a row of 784 values reads differs.  MNIST's pixels are stored row-major, so the
flat row already is 28 steps of 28 pixels (:class:`SequenceShape` ``(28, 28)``): no
data moves, a sequence family reshapes it.

>>> from explore.datasets import get
>>> ds = get("mnist_rows")
>>> ds.sequence, ds.image, ds.features == ds.sequence.features
(SequenceShape(length=28, channels=28, vocab=None, pad=None, masked=False), None, True)
"""

from __future__ import annotations

import dataclasses

from explore.datasets._base import Empty, LoadedData, plain_empty, register
from explore.datasets._mnist import Mnist
from explore.datasets.sequence_shape import SequenceShape


@register("mnist_rows")
class MnistRows(Mnist):
    """MNIST as 28 steps (the image's rows, top to bottom) of 28 pixels."""

    # Mnist's attribute is inferred as a tuple; BaseDataset's type allows None
    image = None  # type: ignore[assignment]
    sequence = SequenceShape(length=28, channels=28)

    def load(self) -> LoadedData:
        return dataclasses.replace(super().load(), name="mnist_rows")

    def load_compact(self, train: int | None = None, valid: int | None = None,
                     empty: Empty = plain_empty) -> LoadedData:
        return dataclasses.replace(super().load_compact(train, valid, empty),
                                   name="mnist_rows")
