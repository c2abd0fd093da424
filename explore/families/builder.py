"""Models from the user's Python: ``model: {builder: "my_models:build"}``.

A builder is a function ``build(trial, data) -> nn.Module | CalcGraph`` that asks
Optuna's trial for its own parameters, define-by-run, as an Optuna objective does, and
reads what it needs of the data from ``data`` (a :class:`~explore.families.DataInfo`:
``n_features``, ``n_classes``, ``input_shape``, ``n_outputs``, ...)::

    def build(trial, data):
        width = trial.suggest_int("width", 16, 128, log=True)
        return Net(data.n_features, width, data.n_outputs)

``build(trial)`` works too: whether a builder takes the data is read from its signature
(:func:`takes_data`).  The scheduler calls it in its own process for each trial, traces
a module into a CalcGraph for the data set's task (:func:`engine.nn.to_graph`: its loss
and the outputs the task's metrics read), checks that the model gives one output per
class (one value for a regression; :func:`check_outputs`), compiles the graph and packs
it like any candidate; what the user's code raises, and a model that does not fit the
data, fails that trial with its reason before any worker trains it, and the run goes
on.  A trial's model is rebuilt later (``explore export-model``,
:func:`explore.load_model`) by calling the builder again with the values it chose
(``optuna.trial.FixedTrial``) and the study's record of the data.  The spec
``module:function`` names a module importable from the search space's folder or the
Python path.

>>> LowTrial().suggest_int("width", 16, 128), LowTrial().suggest_categorical("a", ["x", "y"])
(16, 'x')
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna

from engine import BATCH, CalcGraph, Mode, nn
from engine.compile.passes.shapes import infer_shapes
from engine.compile.passes.validate import validate
from engine.errors import EngineError
from explore.families._base import BuildError, DataInfo, DataShape
from explore.families.tasks import task_of, task_outputs, trace

Builder = Callable[..., Any]  # build(trial) or build(trial, data)


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
    except (Exception, SystemExit) as e:  # the user's module failed to import: say how
        what = f"sys.exit({e.code!r})" if isinstance(e, SystemExit) else \
            f"{type(e).__name__}: {e}"
        raise BuilderError(f"cannot import {module_name!r} (from {base or 'the Python path'}"
                           f"): {what}") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise BuilderError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) "
                               f"has no {attr!r}")
    if not callable(fn):
        raise BuilderError(f"{spec!r} is a {type(fn).__name__}, not a function")
    return fn


class OutputMismatch(BuilderError):
    """A builder's model whose outputs do not fit the data: not one per class of a
    classification, or not one value for a regression (raised when it is traced, before
    any worker trains it).  ``got`` and ``want``: its outputs per row and the data's."""

    def __init__(self, message: str, got: int | tuple[int, ...], want: int) -> None:
        super().__init__(message)
        self.got, self.want = got, want


def spec_of(fn: Builder) -> str | None:
    """``module:qualname`` of a function that can be imported again by that name (None
    for one defined in ``__main__``, a notebook cell or a closure, and for a bound
    method, a ``functools.partial`` or a callable object: the name would not give it
    back).

    >>> spec_of(spec_of), spec_of(lambda trial: None)
    ('explore.families.builder:spec_of', None)
    """
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not isinstance(name, str) or module == "__main__" or "<" in name:
        return None
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return f"{module}:{name}" if found is fn else None


def takes_data(fn: Builder) -> str | None:
    """How ``fn`` takes the data's facts, read from its signature: ``"positional"``
    (``build(trial, data)``: a second positional parameter without a default, or one
    named ``data``), ``"keyword"`` (a keyword-only ``data`` without a default) or None
    (``build(trial)``; also ``*args`` alone, which says nothing: a wrapper is read
    through ``functools.wraps``).  A ``functools.partial`` is read as what is left of
    its function's parameters, a bound method without ``self``.

    >>> import functools
    >>> def build(trial, data, width=8): ...
    >>> takes_data(build), takes_data(lambda trial, width=8: None)
    ('positional', None)
    >>> takes_data(functools.partial(build, data=None)), takes_data(lambda *args: None)
    (None, None)
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the old contract
        return None
    params = list(sig.parameters.values())
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 and (positional[1].default is inspect.Parameter.empty or
                                 positional[1].name == "data"):
        return "positional"
    data = sig.parameters.get("data")
    if data is not None and data.kind is data.KEYWORD_ONLY and data.default is data.empty:
        return "keyword"
    return None


def builder_name(fn: Builder) -> str:
    """Who ``fn`` is, for messages: ``module:function (file:line)`` of its definition
    (a partial's function; a callable object's ``__call__``).

    >>> builder_name(builder_name).startswith("explore.families.builder:builder_name (")
    True
    """
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)  # a bound method: its function
    if not (inspect.isfunction(target) or inspect.isbuiltin(target)) and callable(target) \
            and not inspect.isclass(target):
        target = type(target).__call__
    target = inspect.unwrap(target)
    name = f"{getattr(target, '__module__', '?')}:" \
           f"{getattr(target, '__qualname__', type(target).__name__)}"
    code = getattr(target, "__code__", None)
    if code is None:
        return name
    path = code.co_filename
    try:
        rel = os.path.relpath(path)
        path = path if rel.startswith("..") else rel
    except ValueError:  # another drive (Windows)
        pass
    return f"{name} ({path}:{code.co_firstlineno})"


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


def call_builder(fn: Builder, trial: Any, data: DataShape | DataInfo) -> Any:
    """``fn(trial, data)``, or ``fn(trial)`` for a builder that takes no data
    (:func:`takes_data`); ``data`` is given as a :class:`DataInfo`.  What the user's
    code raises becomes a :class:`BuilderError` with the traceback from the builder down
    (its own frames, not the scheduler's)."""
    how = takes_data(fn)
    try:
        if how == "positional":
            return fn(trial, DataInfo.of(data))
        if how == "keyword":
            return fn(trial, data=DataInfo.of(data))
        return fn(trial)
    except (Exception, SystemExit) as e:  # a builder's sys.exit ends its trial, not the run
        if type(e).__name__ in ("TrialPruned",):
            raise
        tb = traceback.extract_tb(e.__traceback__)[1:]  # from the builder's frame down
        lines = "".join(traceback.format_list(tb)) + f"{type(e).__name__}: {e}"
        raise BuilderError(f"the model builder raised:\n{lines}") from None


def graph_of_model(result: Any, data: DataShape, params: Mapping[str, Any],
                   builder: Builder | None = None) -> CalcGraph:
    """The CalcGraph of what a builder returned, for ``data``'s task: an ``engine.nn``
    module is traced (:func:`~explore.families.tasks.trace`); a CalcGraph must already
    follow the conventions (placeholders ``x`` and ``y``, paths ``train`` and ``eval``,
    the eval outputs the task's metrics read).  Either must give the data's outputs per
    row (:func:`check_outputs`; ``builder`` is named when it does not)."""
    task = task_of(data)
    if isinstance(result, CalcGraph):
        check_conventions(result, task, int(data.classes or 0))
        graph = result
    elif isinstance(result, nn.Module):
        try:
            graph = trace(result, data, params)
        except EngineError:
            # the loss or a metric may refuse the outputs first (a binary classifier of
            # one output): a mismatch with the data is said as such
            with contextlib.suppress(EngineError):
                check_outputs(trace(result, data, params, forward_only=True), data,
                              builder)
            raise
    else:
        raise BuildError(f"the model builder returned a {type(result).__name__}; it returns "
                         "an engine.nn.Module or a CalcGraph")
    check_outputs(graph, data, builder)
    return graph


def check_outputs(graph: CalcGraph, data: DataShape | DataInfo,
                  builder: Builder | None = None) -> None:
    """Raise :class:`OutputMismatch` unless ``graph``'s ``logits`` give ``data``'s
    outputs per row: ``[batch, classes]`` for a classification, ``[batch]`` or
    ``[batch, 1]`` for a regression.  Its shapes are inferred as the compiler infers
    them, without compiling (a millisecond); a graph without ``logits`` is left alone.
    A mismatch found here fails the trial before any worker trains it, where the
    training would otherwise fail on the first batch's labels.

    >>> from explore.families import Shape
    >>> g = trace(nn.Linear(4, 5), Shape(features=4, classes=10), {})
    >>> check_outputs(g, Shape(features=4, classes=10))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    explore.families.builder.OutputMismatch: the model gives 5 outputs per row, but the ...
    """
    if "logits" not in graph.variables:
        return
    info = DataInfo.of(data)
    shape = infer_shapes(validate(graph)).descs["logits"].shape
    want = info.n_outputs
    fits = (BATCH,), (BATCH, 1)  # a regression's value, flat or as a column
    if shape in (fits if info.n_classes is None else ((BATCH, want),)):
        return
    got: int | tuple[int, ...]
    if len(shape) == 2 and shape[0] == BATCH:
        got = shape[1]
        gives = f"{got} output{'s' * (got != 1)} per row"
    else:
        got = shape
        gives = "outputs of shape [" + ", ".join(
            "batch" if i == 0 and d == BATCH else str(d) for i, d in enumerate(shape)) + "]"
    if info.n_classes is None:
        needs = f"a {info.task} predicts 1 value per row: its last layer must give 1"
    else:
        needs = (f"the data set has {want} classes: its last layer must give one per "
                 "class")
    who = "the model" if builder is None else f"the model of builder {builder_name(builder)}"
    raise OutputMismatch(f"{who} gives {gives}, but {needs} (data.n_outputs in "
                         "build(trial, data))", got, want)


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
