"""A search space bound to what it runs on: its data set and, where the space's models
come from the user's Python, the builder function.

The schema (:class:`~explore.space.Space`) is data: it validates a file and reads
nothing else.  Binding reads the data set the ``dataset`` section names (a file is read
and checked), runs the family's checks of the files its model section names (an ONNX
model: :meth:`~explore.families.BaseFamily.check_files`) and imports the builder
``model.builder`` names, once per run, in :func:`explore.runner.prepare`; what is wrong
with any of them is an error at its line of the space's file.  Everything downstream
that compiles a candidate or loads rows takes the :class:`BoundSpace`, so no field read
ever touches a file or imports code.

>>> from explore.space import parse_space
>>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
...                      "memory": "64MB"}})
>>> bound = bind(space)
>>> bound.data.features, bound.uses_builder, bound.space is space
(64, False, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from explore import families
from explore.datasets import BaseDataset, DataError
from explore.datasets.table import resolve
from explore.families.builder import Builder, BuilderError, load_builder
from explore.space import Space


@dataclass(frozen=True)
class BoundSpace:
    """A :class:`~explore.space.Space` with its data set and model builder (None: the
    family named by ``model.family`` makes each trial's model)."""

    space: Space
    data: BaseDataset
    builder: Builder | None = None

    @property
    def uses_builder(self) -> bool:
        """Whether each trial's model comes from the user's builder function."""
        return self.builder is not None


def bind(space: Space, data: BaseDataset | None = None, builder: Builder | None = None
         ) -> BoundSpace:
    """``space`` bound to ``data`` (None: the data set its ``dataset`` section names,
    resolved and checked here) and ``builder`` (None: the function ``model.builder``
    names, imported here, if it names one).  Raises
    :class:`~explore.yamlio.SpaceError` at the line of the section at fault; a data set
    or a builder given from Python is the caller's to check (TypeError)."""
    if data is None:
        data = _resolve(space)
    elif not isinstance(data, BaseDataset):
        raise TypeError(f"a space is bound to a dataset (explore.datasets.from_python(...) "
                        f"makes one of a DataFrame or arrays), not {type(data).__name__}")
    if builder is None and space.model.builder is None:
        _check_files(space)
    if builder is None and space.model.builder is not None:
        try:
            builder = load_builder(space.model.builder, space.model._base)
        except BuilderError as e:
            raise space.error_at(("model", "builder"), str(e)) from e
    elif builder is not None and not callable(builder):
        raise TypeError(f"a model builder is a function of the trial (and the data), not a "
                        f"{type(builder).__name__}")
    return BoundSpace(space, data, builder)


def _check_files(space: Space) -> None:
    """The family's checks of the files its model section names (a model file)."""
    model = {k: getattr(space.model, k) for k in type(space.model).model_fields}
    try:
        families.get(space.model.family).check_files(model)
    except families.AtKey as e:
        raise space.error_at(("model", e.key), str(e)) from None
    except ValueError as e:
        raise space.error_at(("model",), str(e)) from None


def _resolve(space: Space) -> BaseDataset:
    """The data set the ``dataset`` section names, with its row counts checked."""
    if space.dataset is None:
        raise space.error_at(("dataset",), "the space names no dataset: give one in its "
                             "dataset section, or the data from Python (data=...)")
    try:
        data = resolve(space.dataset)
        train, valid = space.dataset.heads
        have = data.known_train_rows
        if valid is not None and valid > data.valid:
            raise DataError(f"{valid:,} validation rows asked for, but the split has "
                            f"{data.valid:,}", key="valid")
        if train is not None and have is not None and train > have:
            raise DataError(f"{train:,} training rows asked for, but the split has "
                            f"{have:,}", key="train")
    except DataError as e:
        raise space.error_at(("dataset", e.key) if e.key else ("dataset",), str(e)) from e
    return data
