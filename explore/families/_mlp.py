"""The MLP family: dense layers only (no convolution blocks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import CalcGraph
from explore.builders import build_graph
from explore.datasets import BaseDataset
from explore.families._base import BaseFamily, register
from explore.ranges import bounds


@register("mlp")
class Mlp(BaseFamily):
    def build(self, params: dict[str, Any], dataset: BaseDataset,
              eval_loss: bool = True) -> CalcGraph:
        return build_graph(params, dataset.features, dataset.classes, eval_loss=eval_loss,
                           image=dataset.image, pixel_scale=dataset.pixel_scale,
                           task=getattr(dataset, "task", "classification"))

    def check(self, model: Mapping[str, Any]) -> None:
        if bounds(model["blocks"])[1] != 0:
            raise ValueError("blocks are for family cnn; an mlp has none")
