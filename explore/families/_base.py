"""What a model family is, and the registry of families by name.

A family turns one candidate's sampled parameters (:func:`explore.sampling.suggest`)
into a :class:`~engine.CalcGraph` for the data set's task, in the conventions of
:mod:`explore.families.tasks` (a ``train`` path into the loss, an ``eval`` path ending
in ``logits`` and in what the task's metrics read), and says which model sections it
accepts.  A family reads of the data set only its shape (:class:`DataShape`): a
:class:`~explore.datasets.BaseDataset`, or a study's record of one when a kept model is
rebuilt.  Families run in the scheduler's process only: what crosses to a worker is the
compiled program, never the family or its graph.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine import CalcGraph
from explore.datasets.sequence_shape import SequenceShape
from explore.registry import Registry


class BuildError(ValueError):
    """Parameters that do not make a model (an unknown activation, ...)."""


class DataShape(Protocol):
    """What a family reads of a data set: ``features`` per row, ``classes`` (0 for a
    regression), the ``task``, the ``image`` shape (channels, height, width; None for a
    table) and the ``pixel_scale`` of rows kept as uint8 pixels (None: float32).  A
    sequence data set also has ``sequence`` (a
    :class:`~explore.datasets.sequence_shape.SequenceShape`), read with
    ``getattr(data, "sequence", None)``: a table or image set has none."""

    @property
    def features(self) -> int: ...
    @property
    def classes(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def image(self) -> tuple[int, int, int] | None: ...
    @property
    def pixel_scale(self) -> float | None: ...


@dataclass(frozen=True)
class Shape:
    """A :class:`DataShape` given by hand, to build a family's model without a data set.

    >>> from explore import families
    >>> g = families.get("mlp").build({"depth": 0, "widths": [], "activations": [],
    ...     "dropouts": [], "init": "he_uniform"}, Shape(features=8, classes=3))
    >>> g.outputs[:2]
    ['loss', 'logits']
    """

    features: int
    classes: int
    task: str = "classification"
    image: tuple[int, int, int] | None = None
    pixel_scale: float | None = None
    sequence: SequenceShape | None = None


@dataclass(frozen=True)
class DataInfo:
    """What a model builder knows of the data it builds for: ``build(trial, data)``
    (:mod:`explore.families.builder`) gets one, so that the model's input width and its
    last layer follow the data set rather than numbers written into the builder.

    ``n_features``: values per row as the model takes them, after preprocessing (a
    table's categories one-hot encoded): the width of the input ``x``, which arrives
    flat, ``[batch, n_features]``.  ``input_shape``: how those values are laid out per
    row, ``(channels, height, width)`` for images (reshape ``x`` to it in ``forward``),
    ``(length, values per step)`` for a sequence (``sequence`` says which steps are
    tokens or padding), ``(n_features,)`` for a table.  ``n_classes``: the classes of a
    classification (None for a regression); ``n_outputs``: what the model's last layer gives per row
    (the classes, or 1 for a regression), which the run checks before any trial trains.
    ``feature_names`` and ``class_labels``: a table's (None for a built-in data set).
    Plain data, made in the scheduler's process from the data set's shape (or a study's
    record of it when a kept model is rebuilt); it never crosses to a worker.

    >>> data = DataInfo.of(Shape(features=64, classes=10, image=(1, 8, 8)))
    >>> data.n_features, data.n_classes, data.input_shape, data.n_outputs
    (64, 10, (1, 8, 8), 10)
    >>> DataInfo.of(Shape(features=3, classes=0, task="regression")).n_outputs
    1
    """

    task: str  # "classification" or "regression"
    n_features: int
    n_classes: int | None
    input_shape: tuple[int, ...]
    feature_names: tuple[str, ...] | None = None
    class_labels: tuple[Any, ...] | None = None
    sequence: SequenceShape | None = None

    @property
    def n_outputs(self) -> int:
        """Values the model predicts per row: its classes, or 1 for a regression."""
        return 1 if self.n_classes is None else self.n_classes

    @classmethod
    def of(cls, data: DataShape | DataInfo) -> DataInfo:
        """The facts of a data set (a :class:`DataShape`: a
        :class:`~explore.datasets.BaseDataset`, :class:`Shape`, or a study's record)."""
        if isinstance(data, DataInfo):
            return data
        task = getattr(data, "task", None) or "classification"
        features = int(data.features)
        image = getattr(data, "image", None)
        pre = getattr(data, "preprocess", None)
        names = getattr(pre, "feature_names", None)
        labels = getattr(pre, "labels", None)
        seq = getattr(data, "sequence", None)
        shape = tuple(int(d) for d in image) if image else \
            (seq.length, seq.step_width) if seq is not None else (features,)
        return cls(task=task, n_features=features,
                   n_classes=None if task == "regression" else int(data.classes or 0),
                   input_shape=shape, feature_names=tuple(names) if names else None,
                   class_labels=tuple(labels) if labels else None, sequence=seq)


# The model keys that only some families read (a space setting one for another family
# is refused at the key).  The common keys (depth, width, ...) are not among them.
FAMILY_ONLY_KEYS = ("d_model", "heads", "layers", "ff_ratio", "pooling", "positional", "norm",
                    "dilation", "readout")


class BaseFamily(ABC):
    """A model family (``model.family`` in a search space)."""

    # which of FAMILY_ONLY_KEYS the family reads: they are among its parameters
    keys: tuple[str, ...] = ()
    # per-layer parameters (dropout...) the family reads as one value, asked of a trial
    # even where the dense head has no layer: ``params[name]``
    scalar_keys: tuple[str, ...] = ()

    @abstractmethod
    def build(self, params: dict[str, Any], data: DataShape,
              eval_loss: bool = True) -> CalcGraph:
        """The model of ``params`` for ``data`` (raises :class:`BuildError` for
        parameters that make no model)."""

    def check(self, model: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Raise ValueError if the ``model`` section (name -> fixed value or range, as
        the schema parsed it) does not fit the family (:class:`AtKey` for a problem of
        one key).  Reads no file: the schema is data.  Accepts everything by default."""

    def check_files(self, model: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Like :meth:`check`, for what needs the files the section names (a model
        file): run once when the space is bound to its data (:func:`explore.binding.bind`).
        Accepts everything by default."""


class AtKey(ValueError):
    """A problem :meth:`BaseFamily.check` finds at one key of the model section: the
    schema reports it at that key's line rather than the section's."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


FAMILIES: Registry[BaseFamily] = Registry("model family")
register = FAMILIES.register
get = FAMILIES.get
