"""engine: describe a model as a CalcGraph, compile it into a program of exactly known
memory size, and run it over one preallocated heap.

>>> import engine
>>> sorted(engine.OPTIMIZERS)
['Adagrad', 'Adam', 'AdamW', 'RMSProp', 'SGD']
"""

from engine.compiler import compile_graph, lower, max_batch, size
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
from engine.program import Program
from engine.vm import VM

__all__ = [
    "BATCH",
    "OPTIMIZERS",
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
]
