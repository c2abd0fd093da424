"""The CNN family: convolution blocks (conv, optional batch norm, relu, optional
residual add and 2x2 max pooling), then the dense layers of the MLP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import CalcGraph
from explore.builders import build_graph
from explore.datasets import BaseDataset
from explore.families._base import BaseFamily, register
from explore.ranges import bounds


@register("cnn")
class Cnn(BaseFamily):
    def build(self, params: dict[str, Any], dataset: BaseDataset,
              eval_loss: bool = True) -> CalcGraph:
        return build_graph(params, dataset.features, dataset.classes, eval_loss=eval_loss,
                           image=dataset.image, pixel_scale=dataset.pixel_scale,
                           task=getattr(dataset, "task", "classification"))

    def check(self, model: Mapping[str, Any]) -> None:
        lowest = bounds(model["blocks"])[0]
        if not (isinstance(lowest, int) and lowest >= 1):
            raise ValueError("family cnn needs blocks of at least 1")
