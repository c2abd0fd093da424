"""The runtime: the program format and its zones, the heap, the VM that runs a program's
bytecode over it, optimizers, backends (numpy, cupy), and the arena, paused states and
pool that switch models in and out of one allocation.

It reads the op table (``engine.ops``) for kernels and never imports the compiler: a
:class:`Program` is plain data that could come from a file.

>>> from engine.runtime import ZONES
>>> ZONES
('forward', 'gradient', 'optimizer', 'workspace')
"""

from engine.runtime.heap import CalcHeap
from engine.runtime.optim import OPTIMIZERS, SGD, Adagrad, Adam, AdamW, Optimizer, RMSProp
from engine.runtime.program import Program
from engine.runtime.vm import VM
from engine.runtime.zones import FORWARD, GRADIENT, OPTIMIZER, WORKSPACE, ZONES

__all__ = [
    "FORWARD",
    "GRADIENT",
    "OPTIMIZER",
    "OPTIMIZERS",
    "SGD",
    "VM",
    "WORKSPACE",
    "ZONES",
    "Adagrad",
    "Adam",
    "AdamW",
    "CalcHeap",
    "Optimizer",
    "Program",
    "RMSProp",
]
