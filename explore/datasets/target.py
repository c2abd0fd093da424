"""A table's target: the task it implies when none is given (:func:`infer_task`), the
checks its values pass, and its classes as codes.

Task inference: a float target with a non-integral value is a regression; a boolean,
text or categorical target is a classification; an integer target (or a float one
whose values are all integral) is a classification unless it has more than 20
distinct values that are more than 10% of the rows (few samples per value: a count or
an amount), which makes it a regression.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explore.datasets.columns import is_numeric
from explore.datasets.errors import DataError
from explore.datasets.preprocess import _plain

MANY_VALUES = 20  # a target with more distinct values than this may be a regression


def infer_task(y: np.ndarray) -> str:
    """``classification`` or ``regression`` for target values ``y`` (the rule is in
    the module's docstring).

    >>> infer_task(np.array([0.5, 1.5])), infer_task(np.array(["a", "b"]))
    ('regression', 'classification')
    """
    y = np.asarray(y)
    if not is_numeric(y) or y.dtype == bool:
        return "classification"
    if y.dtype.kind == "f" and not np.all(np.isfinite(y) & (np.mod(y, 1, where=np.isfinite(y),
                                                             out=np.zeros_like(y)) == 0)):
        return "regression"
    distinct = len(np.unique(y))
    return "regression" if distinct > MANY_VALUES and distinct > 0.1 * len(y) else \
        "classification"


def sorted_unique(y: np.ndarray) -> np.ndarray:
    """The distinct values of ``y``, sorted (as text where text is mixed with numbers)."""
    try:
        return np.unique(y)
    except TypeError:  # text mixed with numbers
        return np.unique(y.astype(str))


def class_codes(y: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Index of each label among the sorted ``labels`` (all present)."""
    if y.dtype == object or labels.dtype == object:
        y, labels = y.astype(str), labels.astype(str)
    return np.searchsorted(labels, y).astype(np.int64)


def encoded(y: np.ndarray, task: str, target_scale: tuple[float, float] | None,
            labels: tuple[Any, ...] | None) -> np.ndarray:
    """Targets as a run trains on them: a regression's standardized with
    ``target_scale`` (float32), a classification's as the index of each in ``labels``.

    >>> encoded(np.array([3.0, 5.0]), "regression", (4.0, 2.0), None).tolist()
    [-0.5, 0.5]
    >>> encoded(np.array(["b", "a"]), "classification", None, ("a", "b")).tolist()
    [1, 0]
    """
    if task == "regression":
        mean, std = target_scale or (0.0, 1.0)
        return ((np.asarray(y, np.float64) - mean) / std).astype(np.float32)
    names = tuple(labels or ())
    return class_codes(y, np.asarray(names, dtype=object if any(
        isinstance(v, str) for v in names) else None))


def check_target(where: str, name: str, y: np.ndarray, task: str) -> None:
    """The target values ``y`` of the source ``where`` (``name``: the target, for
    messages) are of a kind the ``task`` can learn.  (Missing and infinite ones were
    refused or dropped before: :mod:`explore.datasets.missing`.)"""
    if y.dtype.kind in "cmMVS":  # complex, times, raw bytes: neither numbers nor labels
        raise DataError(f"{where}: the target {name} is {y.dtype}: a target is real "
                        f"numbers or class labels", key="target")
    if y.dtype == object:
        _check_label_types(where, name, y)
    numeric = is_numeric(y) and y.dtype != object
    if task == "regression" and not (numeric and y.dtype != bool):
        raise DataError(f"{where}: the target {name} is {y.dtype} ("
                        f"{_plain(y[0])!r}, ...), not numbers: a regression needs a "
                        f"numeric target", key="task")
    if task == "regression" and len(y) and bool(np.all(y == y[0])):
        raise DataError(f"{where}: the target {name} is {_plain(y[0])!r} in every row: "
                        "nothing to learn (r2 has no value there)", key="target")
    if task == "classification" and numeric and y.dtype.kind == "f":
        distinct = len(np.unique(y))
        if distinct > MANY_VALUES and distinct > 0.5 * len(y):
            raise DataError(f"{where}: the target {name} has {distinct} distinct values "
                            f"in {len(y)} rows, too many for classes; use task: "
                            f"regression", key="task")


LABEL_TYPES = (str, int, float, bool)  # what a study records and predict gives back


def _check_label_types(where: str, name: str, y: np.ndarray) -> None:
    """An object target's values are text or numbers of one kind: another type (bytes,
    dates, Decimal) cannot be stored with the study, and text mixed with numbers
    would come back from predict as text."""
    kinds: dict[type, int] = {}
    for i, v in enumerate(y):
        t = type(_plain(v))
        if t not in kinds:
            kinds[t] = i
    odd = [t for t in kinds if not issubclass(t, LABEL_TYPES)]
    if odd:
        t = odd[0]
        raise DataError(f"{where}: the target {name} has a value of type {t.__name__} "
                        f"({_plain(y[kinds[t]])!r}, row {kinds[t]}): class labels are text "
                        "or integers", key="target")
    text = [t for t in kinds if issubclass(t, str)]
    numbers = [t for t in kinds if not issubclass(t, str)]
    if text and numbers:
        raise DataError(f"{where}: the target {name} mixes text ({y[kinds[text[0]]]!r}, "
                        f"row {kinds[text[0]]}) and numbers ({y[kinds[numbers[0]]]!r}, row "
                        f"{kinds[numbers[0]]}): give its labels as one kind", key="target")


def check_classes_seen(where: str, y: np.ndarray, labels: tuple[Any, ...]) -> None:
    """Every class of ``y`` (a validation or test split's targets) is one of the
    training split's ``labels``."""
    unseen = sorted({_plain(v) for v in sorted_unique(y)} - set(labels), key=str)
    if unseen:
        raise DataError(f"{where}: the target has {unseen[0]!r}, a class the "
                        f"training split does not have; classes: "
                        f"{', '.join(map(repr, labels))}", key="target")
