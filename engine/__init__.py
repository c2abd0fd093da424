"""engine: describe a model as a CalcGraph, compile it into a program of exactly known
memory size, and run it over one preallocated heap.

Three layers, imports going one way: describe (``engine.graph``, the op table
``engine.ops``), compile (``engine.compile``) and execute (``engine.runtime``);
``engine.onnx_io`` sits beside them and uses all three.

>>> import engine
>>> sorted(engine.OPTIMIZERS)
['Adagrad', 'Adam', 'AdamW', 'RMSProp', 'SGD']
"""

from engine.compile import (
    DEFAULT_PASSES,
    PASSES,
    Pass,
    compile_graph,
    lower,
    max_batch,
    size,
    to_dot,
)
from engine.errors import (
    BeyondMachineError,
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
from engine.runtime import (
    OPTIMIZERS,
    SGD,
    VM,
    Adagrad,
    Adam,
    AdamW,
    CalcHeap,
    Optimizer,
    Program,
    RMSProp,
)

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
    "BeyondMachineError",
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
