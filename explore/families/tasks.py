"""What a model owes its data set's task: the loss it trains, the outputs its eval path
gives the task's metrics, and the tracing of an :mod:`engine.nn` module into the
family conventions (:func:`trace`).

Every network the project trains follows the same conventions, whichever family or user
builder made it: placeholders ``x`` (the rows, uint8 pixels where the data set keeps
them) and ``y``; a ``train`` path (BACKWARD_ENABLED, with dropout and batch statistics)
into the loss; an ``eval`` path (FORWARD_ONLY) ending in ``logits`` (what an exported
model computes) and in what the task's metrics read (:mod:`explore.metrics.evaluation`).

>>> from engine import nn
>>> from explore.families import Shape
>>> g = trace(nn.Linear(4, 3), Shape(features=4, classes=3), {"loss": "auto"})
>>> [p.name for p in g.paths], g.outputs
(['train', 'eval'], ['loss', 'logits', 'accuracy', 'class_counts', 'eval_loss'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import CalcGraph, nn
from explore.families._base import BuildError, DataShape

LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "mae", "huber")}
REGRESSION_LOSS_OPS = {"mse": "MSELoss", "mae": "MAELoss", "huber": "HuberLoss"}


def task_outputs(task: str, classes: int, eval_loss: bool = True) -> list[str]:
    """What a model's eval path gives for the task's metrics (engine.nn metric names;
    ``loss`` is the output ``eval_loss``).

    >>> task_outputs("classification", 2), task_outputs("regression", 0, eval_loss=False)
    (['accuracy', 'class_counts', 'positive_score', 'loss'], ['regression_sums'])
    """
    if task == "regression":
        stats = ["regression_sums"]
    else:
        stats = ["accuracy", "class_counts", *(["positive_score"] if classes == 2 else [])]
    return [*stats, *(["loss"] if eval_loss else [])]


def task_loss(params: Mapping[str, Any], task: str) -> str:
    """The loss ``params["loss"]`` names for ``task`` (auto: cross-entropy for a
    classification, mse for a regression); BuildError for one that does not suit it.

    >>> task_loss({"loss": "auto"}, "regression"), task_loss({}, "classification")
    ('mse', 'cross_entropy')
    """
    if task not in LOSSES:
        raise BuildError(f"unknown task {task!r}; known: {', '.join(LOSSES)}")
    name = str(params.get("loss") or "auto").lower()
    if name == "auto":
        name = LOSSES[task][0]
    if name not in LOSSES[task]:
        raise BuildError(f"loss {name!r} does not suit a {task}; use "
                         f"{' or '.join(LOSSES[task])}")
    return name


def outputs_of(data: DataShape) -> int:
    """Values a model of ``data`` predicts per sample: its classes, or 1 for a
    regression."""
    return 1 if task_of(data) == "regression" else int(data.classes or 0)


def task_of(data: DataShape) -> str:
    return getattr(data, "task", "classification") or "classification"


def trace(net: nn.Module, data: DataShape, params: Mapping[str, Any],
          eval_loss: bool = True, name: str | None = None,
          forward_only: bool = False) -> CalcGraph:
    """``net`` traced for ``data``'s task (:func:`engine.nn.to_graph`): the loss
    ``params["loss"]`` names, the eval outputs the task's metrics read (``eval_loss``
    among them unless False).  Where ``data`` keeps uint8 pixels (``pixel_scale``) the
    input ``x`` is uint8, a quarter of the bytes of float32, and the model dequantizes
    it, ``x * pixel_scale``, as its first op (fused into the first layer by the
    compiler).  ``forward_only``: the eval path to ``logits`` alone, no loss or metric
    (what the model computes, whatever they would make of it)."""
    task = task_of(data)
    scale = getattr(data, "pixel_scale", None)
    return nn.to_graph(net, inputs={"x": ((0, int(data.features)),
                                          "uint8" if scale else "float32")},
                       loss=None if forward_only else task_loss(params, task),
                       metrics=() if forward_only else task_outputs(
                           task, int(data.classes or 0), eval_loss),
                       name=name, dequantize={"x": scale} if scale else None)
