"""engine.nn: a PyTorch-shaped model API, traced into a :class:`~engine.CalcGraph`.

Write a model as in PyTorch (:class:`Module`, layers, :mod:`engine.nn.functional`,
tensor arithmetic); :func:`to_graph` runs its ``forward`` once per path on symbolic
tensors and records the ops, giving a graph with a ``train`` path (ending in ``loss``)
and an ``eval`` path (``logits`` and the metrics) that compiles to an exact-memory
program like any other.  Parameters keep PyTorch's names and shapes, so weights move
between PyTorch and the engine by name (``state_dict``/``load_state_dict``, or
``vm.assign``/``vm.get``).

>>> import numpy as np
>>> from engine import SGD, VM, compile_graph, nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.conv = nn.Conv2d(1, 4, 3, padding=1)
...         self.bn = nn.BatchNorm2d(4)
...         self.head = nn.Linear(4, 10)
...     def forward(self, x):
...         h = nn.functional.relu(self.bn(self.conv(x.reshape(-1, 1, 8, 8))))
...         return self.head(nn.functional.global_avg_pool(h).flatten(1))
>>> g = nn.to_graph(Net(), inputs={"x": (0, 64)}, loss="cross_entropy", metrics=["accuracy"])
>>> [v for v in g.variables if v.startswith("bn.")]
['bn.weight', 'bn.bias', 'bn.running_mean', 'bn.running_var']
>>> prog = compile_graph(g, batch_size=8, optimizer=SGD(lr=0.1))
>>> vm = VM(prog, seed=0); vm.allocated_bytes == prog.total_bytes
True
"""

from engine.nn import functional
from engine.nn._tensor import Tensor
from engine.nn._trace import NNError, TraceError, batch
from engine.nn.build import LOSSES, METRICS, to_graph
from engine.nn.functional import cat, concat
from engine.nn.layers import (
    CELU,
    ELU,
    GELU,
    SELU,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Hardswish,
    Identity,
    InstanceNorm1d,
    InstanceNorm2d,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool1d,
    MaxPool2d,
    Mish,
    PReLU,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
    Upsample,
)
from engine.nn.module import (
    IncompatibleKeys,
    Module,
    ModuleList,
    Parameter,
    Sequential,
    manual_seed,
)
from engine.nn.transformer import (
    LearnedPositionalEmbedding,
    MultiheadAttention,
    SinusoidalPositionalEncoding,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "LOSSES",
    "METRICS",
    "SELU",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "Hardswish",
    "Identity",
    "IncompatibleKeys",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "LayerNorm",
    "LeakyReLU",
    "LearnedPositionalEmbedding",
    "Linear",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool2d",
    "Mish",
    "Module",
    "ModuleList",
    "MultiheadAttention",
    "NNError",
    "PReLU",
    "Parameter",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "SinusoidalPositionalEncoding",
    "Softmax",
    "Softplus",
    "Tanh",
    "Tensor",
    "TraceError",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "Upsample",
    "batch",
    "cat",
    "concat",
    "functional",
    "manual_seed",
    "to_graph",
]
