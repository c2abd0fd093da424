"""The ResNet family: a stem, ``blocks`` stages of ``stage_blocks`` residual blocks with
batch norm (widths ``channels``, per stage with ``per_layer``; stages after the first
downsampled by ``stride``), global average pooling, then the dense layers of the MLP
(``depth: 0`` for a linear classifier)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import CalcGraph
from explore.builders import build_graph
from explore.datasets import BaseDataset
from explore.families._base import BaseFamily, register
from explore.ranges import bounds


@register("resnet")
class ResNetFamily(BaseFamily):
    def build(self, params: dict[str, Any], dataset: BaseDataset,
              eval_loss: bool = True) -> CalcGraph:
        return build_graph(params, dataset.features, dataset.classes, eval_loss=eval_loss,
                           image=dataset.image, pixel_scale=dataset.pixel_scale,
                           task=getattr(dataset, "task", "classification"), family="resnet")

    def check(self, model: Mapping[str, Any]) -> None:
        lowest = bounds(model["blocks"])[0]
        if not (isinstance(lowest, int) and lowest >= 1):
            raise ValueError("family resnet needs blocks (stages) of at least 1")
