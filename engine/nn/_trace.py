"""Tracing: the recorder that turns calls on symbolic tensors into nodes of a path, the
symbolic batch size, and the errors that point at the user's line.

A :class:`Tracer` is active while :func:`engine.nn.to_graph` runs a module's ``forward``
for one path.  Every operation checks its inputs with the op table's shape rule *at
once* (``get_op(op).shape(descs, attrs)``, a leading ``0`` being the batch), so a shape
mismatch is reported at the line that made it, not later by the compiler.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.graph import BATCH, CalcGraph, DType, Init, Kind, Path, TensorDesc
from engine.ops import get_op

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NUMPY = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


class NNError(EngineError):
    """A misuse of :mod:`engine.nn` outside tracing (a state dict that does not fit, a
    layer built with arguments it does not support)."""


def user_frame() -> tuple[str, int] | None:
    """(file, line) of the innermost stack frame outside :mod:`engine.nn` (and numpy):
    the user's line that asked for what failed."""
    f = sys._getframe(1)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if not name.startswith(_HERE) and not name.startswith(_NUMPY):
            return f.f_code.co_filename, f.f_lineno
        f = f.f_back  # type: ignore[assignment]
    return None


class TraceError(NNError):
    """Something in a traced ``forward`` (or a ``to_graph`` argument) that cannot become a
    graph: data-dependent control flow, numpy on a traced value, a shape mismatch, an
    unsupported call or argument.  The message starts with the user's ``file:line``
    (also :attr:`filename`, :attr:`lineno`) and quotes that line; :attr:`reason` is the
    bare explanation."""

    def __init__(self, reason: str, where: tuple[str, int] | None = None) -> None:
        where = where or user_frame()
        self.reason = reason
        self.filename: str | None = where[0] if where else None
        self.lineno: int | None = where[1] if where else None
        tracer = _active()
        if tracer is not None and tracer.module_stack:
            reason = f"{reason} (in {tracer.module_stack[-1]}, path {tracer.path.name!r})"
        elif tracer is not None:
            reason = f"{reason} (path {tracer.path.name!r})"
        text = reason
        if where:
            line = linecache.getline(where[0], where[1]).strip()
            text = f"{where[0]}:{where[1]}: {reason}" + (f"\n    {line}" if line else "")
        super().__init__(text)


class _Batch:
    """The symbolic batch size: what ``tensor.shape[0]`` is for a batched tensor while
    tracing (the graph is compiled for any batch).  It may be passed back to
    ``reshape``/``view`` as the leading dimension; arithmetic on it or ``int()`` of it
    is a :class:`TraceError`.

    >>> from engine.nn import batch
    >>> batch
    batch
    """

    _instance: _Batch | None = None

    def __new__(cls) -> _Batch:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "batch"

    def _symbolic(self, *args: Any) -> Any:
        raise TraceError("the batch size is symbolic while tracing (the graph runs at any "
                         "batch): it cannot be computed with; pass it (or -1) as the "
                         "leading dimension of reshape/view")

    __index__ = __int__ = __float__ = _symbolic
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _symbolic
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _symbolic
    __lt__ = __le__ = __gt__ = __ge__ = _symbolic


batch = _Batch()


class GraphState:
    """What both paths of one ``to_graph`` share: the graph, the parameters' variable
    names (by the identity of the :class:`~engine.nn.Parameter`), the constants made
    so far and the modules' qualified names."""

    def __init__(self, graph: CalcGraph) -> None:
        self.graph = graph
        self.params: dict[int, str] = {}
        self.module_names: dict[int, str] = {}
        self.descs: dict[str, TensorDesc] = {}
        self._scalars: dict[tuple[float, str], str] = {}

    def scalar(self, value: float, dtype: DType) -> str:
        """A frozen scalar parameter holding ``value`` (one per value and dtype)."""
        key = (float(value), dtype.value)
        name = self._scalars.get(key)
        if name is None:
            name = self.graph.constant(float(value), dtype=dtype).name
            self.descs[name] = TensorDesc(dtype, ())
            self._scalars[key] = name
        return name

    def array(self, values: np.ndarray, dtype: DType) -> str:
        """A frozen parameter holding ``values`` (a numpy operand of the model)."""
        name = self.graph.fresh_name("const")
        shape = tuple(int(d) for d in values.shape)
        if 0 in shape:
            raise TraceError(f"a numpy constant of shape {shape} has a zero-size dimension")
        self.graph.parameter(name, shape, Init.from_array(values), dtype=dtype, trainable=False)
        self.descs[name] = TensorDesc(dtype, shape)
        return name


class Tracer:
    """Records one path: ``emit`` checks shapes and appends nodes."""

    tensor_type: Any = None  # engine.nn.Tensor, set where it is defined (no import cycle)

    def __init__(self, state: GraphState, path: Path, training: bool) -> None:
        self.state = state
        self.path = path
        self.training = training
        self.module_stack: list[str] = []

    @property
    def graph(self) -> CalcGraph:
        return self.state.graph

    def emit(self, op: str, inputs: Sequence[Any], **attrs: Any) -> Any:
        """Append ``op`` over traced tensors and return its output (output 0) as a
        :class:`~engine.nn.Tensor`; a failing shape rule is a :class:`TraceError` naming
        the op, the input shapes and the user's line."""
        descs = [t.desc for t in inputs]
        definition = get_op(op)
        try:
            out = definition.shape(descs, definition.with_defaults(attrs))[0]
        except (EngineError, ValueError, IndexError, TypeError, KeyError) as e:
            shapes = ", ".join(_show(d) for d in descs)
            raise TraceError(f"{op}({shapes}) failed: {e}") from None
        var = self.path.op(op, *(t.name for t in inputs), **attrs)
        self.state.descs[var.name] = out
        return self.tensor_type(self, var.name, out)

    def tensor(self, name: str) -> Any:
        return self.tensor_type(self, name, self.state.descs[name])

    def rename(self, tensor: Any, name: str) -> Any:
        """Give ``tensor`` the variable name ``name`` (``logits``, ``loss``): the node of
        this path that made it is renamed, or an Identity is added for a variable it did
        not make (a placeholder, a parameter)."""
        g = self.graph
        if name in g.variables:
            raise TraceError(f"the graph already has a variable named {name!r}; rename the "
                             "input or parameter that takes it")
        var = g.variables[tensor.name]
        made_here = var.kind == Kind.GENERIC and any(tensor.name in n.outputs
                                                     for n in self.path.nodes)
        if not made_here:
            out = self.path.op("Identity", tensor.name, outputs=[name])
            self.state.descs[out.name] = tensor.desc
            return self.tensor(out.name)
        old = tensor.name
        del g.variables[old]
        var.name = name
        g.variables[name] = var
        for n in self.path.nodes:
            n.inputs = tuple(name if i == old else i for i in n.inputs)
            n.outputs = tuple(name if o == old else o for o in n.outputs)
        self.state.descs[name] = self.state.descs.pop(old)
        return self.tensor(name)


def _show(d: TensorDesc) -> str:
    return str(d)


_LOCAL = threading.local()


def _active() -> Tracer | None:
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1] if stack else None


def current(what: str = "this call") -> Tracer:
    """The active tracer; outside tracing, a :class:`TraceError` saying how to trace."""
    t = _active()
    if t is None:
        raise TraceError(f"{what} needs a traced value: engine.nn modules and functions run "
                         "only while nn.to_graph(module, inputs=...) traces them")
    return t


def tracing() -> bool:
    return _active() is not None


@contextmanager
def trace(tracer: Tracer) -> Iterator[Tracer]:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    stack.append(tracer)
    try:
        yield tracer
    finally:
        stack.pop()


def generic_shape(desc: TensorDesc) -> tuple[Any, ...]:
    """A descriptor's shape as a traced tensor shows it: the batch as :data:`batch`."""
    return tuple(batch if (i == 0 and d == BATCH) else d for i, d in enumerate(desc.shape))
