"""Models from the user's Python: ``model: {builder: "my_models:build"}``.

A builder is a function ``build(trial) -> nn.Module | CalcGraph`` that asks Optuna's
trial for its own parameters, define-by-run, as an Optuna objective does::

    def build(trial):
        width = trial.suggest_int("width", 16, 128, log=True)
        return Net(width, trial.suggest_int("blocks", 1, 3))

The scheduler calls it in its own process for each trial, traces a module into a
CalcGraph for the data set's task (:func:`engine.nn.to_graph`: its loss and the
outputs the task's metrics read), compiles the graph and packs it like any candidate;
what the user's code raises fails that trial, with the user's traceback, and the run
goes on.  A trial's model is rebuilt later (``explore export-model``,
:func:`explore.load_model`) by calling the builder again with the values it chose
(``optuna.trial.FixedTrial``).  The spec ``module:function`` names a module importable
from the search space's folder or the Python path.

>>> LowTrial().suggest_int("width", 16, 128), LowTrial().suggest_categorical("a", ["x", "y"])
(16, 'x')
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna

from engine import CalcGraph, Mode, nn
from explore.families._base import BuildError, DataShape
from explore.families.tasks import task_of, task_outputs, trace

Builder = Callable[[Any], Any]


class BuilderError(BuildError):
    """A builder that cannot be had, or that raised (its traceback in the message)."""


def load_builder(spec: str, base: str | Path | None = None) -> Builder:
    """The function ``module:function`` names, the module imported from ``base`` (the
    search space's folder) or the Python path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BuilderError(f"{spec!r}: write module:function, e.g. my_models:build")
    if base is not None and str(base) not in sys.path:
        sys.path.insert(0, str(base))  # the space's folder, as a script's own folder is
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module failed to import: say how
        raise BuilderError(f"cannot import {module_name!r} (from {base or 'the Python path'}"
                           f"): {type(e).__name__}: {e}") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise BuilderError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) "
                               f"has no {attr!r}")
    if not callable(fn):
        raise BuilderError(f"{spec!r} is a {type(fn).__name__}, not a function")
    return fn


def spec_of(fn: Builder) -> str | None:
    """``module:qualname`` of an importable function (None for one defined in
    ``__main__``, a notebook cell or a closure: it cannot be imported again)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        return None
    return f"{module}:{name}"


class LowTrial:
    """A stand-in trial whose every ``suggest_*`` answers the low end (or the first
    choice): the smallest candidate of a builder, for ``explore size`` and the run's
    minimum budget."""

    number = 0
    params: dict[str, Any]

    def __init__(self, given: Mapping[str, Any] | None = None) -> None:
        self.given = dict(given or {})  # values that win over the low ends
        self.params = {}
        self.user_attrs: dict[str, Any] = {}

    def _answer(self, name: str, low: Any) -> Any:
        return self.params.setdefault(name, self.given.get(name, low))

    def suggest_int(self, name: str, low: int, high: int, **kw: Any) -> int:
        return int(self._answer(name, int(low)))

    def suggest_float(self, name: str, low: float, high: float, **kw: Any) -> float:
        return float(self._answer(name, float(low)))

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._answer(name, next(iter(choices)))

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value

    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False


def replay(values: Mapping[str, Any]) -> Any:
    """A trial that answers each ``suggest_*`` with the value a trial chose."""
    return optuna.trial.FixedTrial(dict(values))


def call_builder(fn: Builder, trial: Any) -> Any:
    """``fn(trial)``; what the user's code raises becomes a :class:`BuilderError` with
    the traceback from the builder down (its own frames, not the scheduler's)."""
    try:
        return fn(trial)
    except Exception as e:
        if type(e).__name__ in ("TrialPruned",):
            raise
        tb = traceback.extract_tb(e.__traceback__)[1:]  # from the builder's frame down
        lines = "".join(traceback.format_list(tb)) + f"{type(e).__name__}: {e}"
        raise BuilderError(f"the model builder raised:\n{lines}") from None


def graph_of_model(result: Any, data: DataShape, params: Mapping[str, Any]) -> CalcGraph:
    """The CalcGraph of what a builder returned, for ``data``'s task: an ``engine.nn``
    module is traced (:func:`~explore.families.tasks.trace`); a CalcGraph must already
    follow the conventions (placeholders ``x`` and ``y``, paths ``train`` and ``eval``,
    the eval outputs the task's metrics read)."""
    task = task_of(data)
    if isinstance(result, CalcGraph):
        check_conventions(result, task, int(data.classes or 0))
        return result
    if not isinstance(result, nn.Module):
        raise BuildError(f"the model builder returned a {type(result).__name__}; it returns "
                         "an engine.nn.Module or a CalcGraph")
    return trace(result, data, params)


def check_conventions(g: CalcGraph, task: str, classes: int) -> None:
    """Raise BuildError unless ``g`` is shaped as the families' graphs are."""
    problems = []
    for name in ("x", "y"):
        if name not in g.variables:
            problems.append(f"no placeholder {name!r}")
    paths = {p.name: p for p in g.paths}
    train, ev = paths.get("train"), paths.get("eval")
    if train is None or train.mode is not Mode.BACKWARD_ENABLED or train.loss is None:
        problems.append("no BACKWARD_ENABLED path 'train' with a loss")
    if ev is None or ev.mode is not Mode.FORWARD_ONLY:
        problems.append("no FORWARD_ONLY path 'eval'")
    want = ["eval_loss" if o == "loss" else o for o in task_outputs(task, classes)]
    missing = [o for o in want if o not in g.variables]
    if missing:
        problems.append(f"the eval path lacks {', '.join(missing)} (what the {task}'s "
                        "metrics read)")
    if problems:
        raise BuildError("the CalcGraph the builder returned does not follow the "
                         "conventions: " + "; ".join(problems))
