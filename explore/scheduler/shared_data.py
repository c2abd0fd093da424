"""The data set the workers train on, loaded once into the run's shared file."""

from __future__ import annotations

from explore.binding import BoundSpace
from explore.datasets import DataError, LoadedData, compact
from explore.scheduler.shared_arrays import SharedArrays, SharedMemoryFull
from explore.space import Space

NAMES = ("x_train", "y_train", "x_valid", "y_valid")


def _heads(space: Space) -> tuple[int | None, int | None]:
    return space.dataset.heads if space.dataset is not None else (None, None)


def load_shared(bound: BoundSpace) -> SharedArrays:
    """The space's rows of its data set (the ``dataset`` section's
    ``train``/``valid`` heads, images as uint8 where the dataset has a pixel scale, a
    table's rows preprocessed), loaded straight into a new shared file: the data exists
    once, compact, from the first byte read.  Raises the dataset's
    :class:`~explore.datasets.DataError` (a shared-memory file system without room for
    the rows is one too); nothing is left behind then."""
    shared = SharedArrays()
    try:
        data = bound.data.load_compact(*_heads(bound.space), empty=shared.empty)
        # A dataset that ignored ``empty`` gave arrays of its own: copy those in.
        for name, a in zip(NAMES, (data.train.x, data.train.y, data.valid.x, data.valid.y),
                           strict=True):
            if name not in shared.spec:
                shared.put(name, a)
    except SharedMemoryFull as e:
        shared.close()
        raise DataError(e.strerror or str(e)) from None
    except BaseException:
        shared.close()
        raise
    return shared


def share_dataset(bound: BoundSpace, data: LoadedData) -> SharedArrays:
    """The space's share of ``data`` (already loaded: a test's or a notebook's) in a new
    shared file, as :func:`load_shared` would have loaded it."""
    shared = SharedArrays()
    try:
        compact(data, *_heads(bound.space), bound.data.pixel_scale, empty=shared.empty)
    except BaseException:
        shared.close()
        raise
    return shared
