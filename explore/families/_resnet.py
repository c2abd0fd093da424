"""The ResNet family: a 3x3 stem with batch norm, ``blocks`` stages of ``stage_blocks``
basic blocks (stage ``i`` is ``channels[i]`` wide, per stage with ``per_layer``; every
stage after the first starts with a stride of ``stride``), global average pooling, then
the dense layers of the MLP (``depth: 0`` for a linear classifier)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import nn
from explore.families._base import BuildError, DataShape, register
from explore.families.layers import Dense, ModuleFamily, channels_of, image_of, stride_of
from explore.ranges import bounds


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, added to the input
    (through a 1x1 convolution with batch norm where the width or the stride changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride,
                                                    bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: Any) -> Any:
        h = nn.functional.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return nn.functional.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """The ResNet family's network."""

    def __init__(self, params: dict[str, Any], image: tuple[int, int, int], n_out: int
                 ) -> None:
        super().__init__()
        channels = channels_of(params)
        stride = stride_of(params)
        per_stage = int(params.get("stage_blocks") or 1)
        if per_stage < 1:
            raise BuildError(f"stage_blocks must be positive, got {per_stage}")
        self.image = image
        self.stem = nn.Sequential(nn.Conv2d(image[0], channels[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels[0]), nn.ReLU())
        stages, c = [], channels[0]
        for i, width in enumerate(channels):
            blocks = []
            for j in range(per_stage):
                blocks.append(BasicBlock(c, width, stride if i and j == 0 else 1))
                c = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = Dense(params, c, n_out)

    def forward(self, x: Any) -> Any:
        h = self.stages(self.stem(x.reshape(-1, *self.image)))
        return self.head(nn.functional.global_avg_pool(h).flatten(1))


@register("resnet")
class ResNetFamily(ModuleFamily):
    name = "resnet"

    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        return ResNet(params, image_of(data, "resnet"), outputs)

    def check(self, model: Mapping[str, Any]) -> None:
        lowest = bounds(model["blocks"])[0]
        if not (isinstance(lowest, int) and lowest >= 1):
            raise ValueError("family resnet needs blocks (stages) of at least 1")
