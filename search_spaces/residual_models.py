"""Model builders for ``residual_mnist.yaml``: networks written with ``engine.nn`` as a
PyTorch user writes them, and ``build(trial, data)``, which asks Optuna for the
architecture (define-by-run) and returns the module, shaped by the data's facts (its
image shape and classes: :class:`explore.families.DataInfo`).  ``explore`` traces it
into a CalcGraph, sizes it to the byte and packs it like any candidate.

>>> import optuna
>>> from explore.families import DataInfo
>>> data = DataInfo(task="classification", n_features=784, n_classes=10,
...                 input_shape=(1, 28, 28))
>>> trial = optuna.trial.FixedTrial({"width": 8, "blocks": 1, "stem_stride": 2})
>>> net = build(trial, data)
>>> [name for name, _ in net.named_parameters()][:3], net.head.out_features
(['stem.weight', 'stem.bias', 'blocks.0.conv1.weight'], 10)
"""

from __future__ import annotations

from typing import Any

from engine import nn


class Residual(nn.Module):
    """Two 3x3 convolutions with batch norm, added to the block's input."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: Any) -> Any:
        h = nn.functional.relu(self.bn1(self.conv1(x)))
        return nn.functional.relu(x + self.bn2(self.conv2(h)))


class Net(nn.Module):
    """A stem convolution (stride 1 or 2), ``blocks`` residual blocks, global average
    pooling and a linear classifier, for images of ``shape`` (channels, height, width)
    given as flat rows."""

    def __init__(self, width: int, blocks: int, stem_stride: int = 2,
                 classes: int = 10, shape: tuple[int, ...] = (1, 28, 28)) -> None:
        super().__init__()
        self.shape = shape
        self.stem = nn.Conv2d(shape[0], width, 3, stride=stem_stride, padding=1)
        self.blocks = nn.Sequential(*[Residual(width) for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: Any) -> Any:
        x = self.blocks(nn.functional.relu(self.stem(x.reshape(-1, *self.shape))))
        return self.head(nn.functional.global_avg_pool(x).flatten(1))


def build(trial: Any, data: Any) -> Net:
    """The trial's network for ``data``'s images and classes: its width, depth in
    blocks and stem stride."""
    return Net(width=trial.suggest_categorical("width", [8, 16, 24]),
               blocks=trial.suggest_int("blocks", 1, 3),
               stem_stride=trial.suggest_categorical("stem_stride", [2]),
               classes=data.n_outputs, shape=data.input_shape)
