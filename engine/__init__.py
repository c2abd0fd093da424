"""engine: describe a model as a CalcGraph, compile it into a program of exactly known
memory size, and run it over one preallocated heap.

>>> import engine
>>> sorted(engine.OPTIMIZERS)
['Adagrad', 'Adam', 'AdamW', 'RMSProp', 'SGD']
"""

from engine.compiler import compile_graph, lower, max_batch, size
from engine.dot import to_dot
from engine.errors import (
    BudgetError,
    CompileError,
    EngineError,
    GraphError,
    InputError,
    ShapeError,
)
from engine.graph import (
    BATCH,
    CalcGraph,
    Device,
    DType,
    Init,
    Kind,
    Mode,
    Path,
    Regularization,
    TensorDesc,
    Var,
)
from engine.heap import CalcHeap
from engine.optim import OPTIMIZERS, SGD, Adagrad, Adam, AdamW, Optimizer, RMSProp
from engine.passes.pipeline import DEFAULT_PASSES, PASSES, Pass
from engine.program import Program
from engine.vm import VM

__all__ = [
    "BATCH",
    "DEFAULT_PASSES",
    "OPTIMIZERS",
    "PASSES",
    "SGD",
    "VM",
    "Adagrad",
    "Adam",
    "AdamW",
    "BudgetError",
    "CalcGraph",
    "CalcHeap",
    "CompileError",
    "DType",
    "Device",
    "EngineError",
    "GraphError",
    "Init",
    "InputError",
    "Kind",
    "Mode",
    "Optimizer",
    "Pass",
    "Path",
    "Program",
    "RMSProp",
    "Regularization",
    "ShapeError",
    "TensorDesc",
    "Var",
    "compile_graph",
    "lower",
    "max_batch",
    "size",
    "to_dot",
]
