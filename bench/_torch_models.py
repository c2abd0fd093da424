"""The built-in model families in PyTorch, layer for layer as :mod:`explore.builders`
builds them, for the benchmarks whose baselines train what explore trains.

``params`` is what :func:`explore.sampling.suggest` gives a trial (``depth``,
``widths``, ``activations``, ``dropouts``, ``init``; for a CNN ``blocks``, ``channels``,
``kernel``, ``batch_norm``, ``residual``, ``pool``, ``stride``), so a baseline asks its
Optuna trial exactly the questions explore asks.  Inits are drawn as the engine draws
them (PyTorch's ``kaiming_uniform_`` for ReLU has the engine's He bound, sqrt(6 / fan_in));
biases start at zero.

>>> import torch
>>> p = {"depth": 1, "widths": [8], "activations": ["relu"], "dropouts": [0.0],
...      "init": "he_uniform", "blocks": 1, "channels": [4], "kernel": 3,
...      "batch_norm": True, "residual": False}
>>> model(p, n_in=64, n_out=10, image=(1, 8, 8))(torch.zeros(2, 64)).shape
torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU}
INITS: dict[str, Callable[[torch.Tensor], Any]] = {
    "xavier_uniform": nn.init.xavier_uniform_,
    "xavier_normal": nn.init.xavier_normal_,
    "he_uniform": lambda w: nn.init.kaiming_uniform_(w, nonlinearity="relu"),
    "he_normal": lambda w: nn.init.kaiming_normal_(w, nonlinearity="relu"),
    "lecun_normal": lambda w: nn.init.normal_(w, 0.0, (1.0 / w.shape[1]) ** 0.5),
    "normal": lambda w: nn.init.normal_(w, 0.0, 0.05),
    "uniform": lambda w: nn.init.uniform_(w, -0.05, 0.05)}
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}

FUSED = ("sgd", "adam", "adamw")  # fused on the CPU and on CUDA


def _linear(n_in: int, n_out: int, init: str) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    INITS[init](layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def dense(params: dict[str, Any], n_in: int, n_out: int) -> nn.Sequential:
    """``depth`` hidden layers (Linear, activation, dropout), then the output layer."""
    depth = int(params["depth"])
    widths = [int(w) for w in params["widths"]][:depth]
    layers: list[nn.Module] = []
    sizes = [n_in, *widths]
    for i, width in enumerate(widths):
        layers += [_linear(sizes[i], width, params["init"]),
                   ACTIVATIONS[params["activations"][i]]()]
        if float(params["dropouts"][i]) > 0:
            layers.append(nn.Dropout(float(params["dropouts"][i])))
    layers.append(_linear(sizes[-1], n_out, params["init"]))
    return nn.Sequential(*layers)


class ConvBlock(nn.Module):
    """Convolution ("same" padding, no bias under batch norm), batch norm, residual add,
    ReLU, 2x2 max pooling: explore's ``ConvBlock``."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int, norm: bool,
                 residual: bool, pooled: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=not norm)
        nn.init.kaiming_uniform_(self.conv.weight, nonlinearity="relu")
        if self.conv.bias is not None:
            nn.init.zeros_(self.conv.bias)
        self.norm = nn.BatchNorm2d(c_out) if norm else None
        self.residual = residual
        self.pool = nn.MaxPool2d(2, 2) if pooled else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.conv(x)
        if self.norm is not None:
            z = self.norm(z)
        if self.residual:
            z = z + x
        h = torch.relu(z)
        return self.pool(h) if self.pool is not None else h


class ConvNet(nn.Module):
    """explore's CNN family: ``blocks`` convolution blocks, then the dense layers."""

    def __init__(self, params: dict[str, Any], image: tuple[int, int, int], n_out: int
                 ) -> None:
        super().__init__()
        k, stride = int(params["kernel"]), int(params.get("stride", 1))
        norm = bool(params.get("batch_norm", False))
        self.image = image
        c, h, w = image
        blocks = []
        for width in [int(c) for c in params["channels"]][:int(params["blocks"])]:
            h, w = -(-h // stride), -(-w // stride)
            pooled = bool(params.get("pool", True)) and h >= 2 and w >= 2
            residual = bool(params.get("residual", False)) and width == c and stride == 1
            blocks.append(ConvBlock(c, width, k, stride, norm, residual, pooled))
            c, h, w = width, (h // 2 if pooled else h), (w // 2 if pooled else w)
        self.blocks = nn.Sequential(*blocks)
        self.head = dense(params, c * h * w, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x.reshape(-1, *self.image)).flatten(1))


def model(params: dict[str, Any], n_in: int, n_out: int,
          image: tuple[int, int, int] | None = None) -> nn.Module:
    """The network of ``params``: the CNN family when ``blocks`` > 0, else the MLP."""
    if int(params.get("blocks") or 0):
        if image is None:
            raise ValueError("a CNN needs the data set's image shape")
        return ConvNet(params, image, n_out)
    return dense(params, n_in, n_out)


def optimizer(params: dict[str, Any], parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The trial's optimizer, the fastest implementation PyTorch has for it on the
    parameters' device (fused where it exists, else foreach)."""
    name = str(params.get("optimizer", "adam"))
    kw: dict[str, Any] = {"lr": float(params["lr"]),
                          "weight_decay": float(params.get("weight_decay") or 0.0)}
    if name in ("sgd", "rmsprop"):
        kw["momentum"] = float(params.get("momentum") or 0.0)
    cls = OPTIMIZERS[name]
    # Adagrad's fused kernel is the CPU's only, and it fails at the first step, not here
    on_cpu = all(p.device.type == "cpu" for p in parameters)
    if name in FUSED or (name == "adagrad" and on_cpu):
        try:
            return cls(parameters, fused=True, **kw)
        except (RuntimeError, TypeError, ValueError):
            pass
    return cls(parameters, foreach=True, **kw)
