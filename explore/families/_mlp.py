"""The MLP family: ``depth`` hidden dense layers of ``widths[i]`` units with
``activations[i]`` and ``dropouts[i]``, then the output layer (the classes' logits, or
one value for a regression)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import nn
from explore.families._base import DataShape, register
from explore.families.layers import Dense, ModuleFamily
from explore.ranges import bounds


class Mlp(nn.Module):
    """The MLP family's network: the dense layers alone."""

    def __init__(self, params: dict[str, Any], n_in: int, n_out: int) -> None:
        super().__init__()
        self.head = Dense(params, n_in, n_out)

    def forward(self, x: Any) -> Any:
        return self.head(x)


@register("mlp")
class MlpFamily(ModuleFamily):
    name = "mlp"

    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        return Mlp(params, int(data.features), outputs)

    def check(self, model: Mapping[str, Any]) -> None:
        if bounds(model["blocks"])[1] != 0:
            raise ValueError("blocks are for family cnn; an mlp has none")
