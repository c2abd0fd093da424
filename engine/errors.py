"""Errors raised by the engine.  Each message names what is at fault: the variable,
the op (its index, name and path) and the shapes involved."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on bad input."""


class GraphError(EngineError):
    """The graph is malformed: unknown op, undefined variable, missing loss..."""


class UnsupportedForm(GraphError):
    """An operator this engine has, in a form of it (a mode, an attribute) it does
    not; the message names the form."""


class ShapeError(EngineError):
    """Shapes or dtypes do not fit an operator's rule."""


class ZeroSizeError(ShapeError):
    """A tensor would have a dimension of size 0, which this engine cannot hold (0 marks
    the batch dimension in shapes)."""


class CompileError(EngineError):
    """The graph cannot be compiled as asked (optimizer without a learnable path...)."""


class BudgetError(CompileError):
    """The memory budget cannot hold the program, even at batch 1."""


class BeyondMachineError(BudgetError):
    """The program needs more bytes than the machine's physical memory: no budget on
    this machine holds it."""


class InputError(EngineError):
    """Data handed to a running program is wrong: shape, dtype, NaN, unknown name."""
