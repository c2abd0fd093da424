"""The CNN family: ``blocks`` convolution blocks (convolution with "same" padding,
optional batch norm, Relu, optional residual add and 2x2 max pooling) on rows viewed as
the data set's images, then the dense layers of the MLP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import Init, nn
from explore.families._base import BuildError, DataShape, register
from explore.families.layers import Dense, ModuleFamily, channels_of, image_of, stride_of
from explore.ranges import bounds


class ConvBlock(nn.Module):
    """Convolution ("same" padding; no bias under batch norm, whose shift makes it
    redundant), optional batch norm, an optional residual add, Relu, optional 2x2 max
    pooling."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int, norm: bool,
                 residual: bool, pooled: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=not norm)
        self.conv.weight.init = Init.he_uniform(fan_in=c_in * k * k)
        if self.conv.bias is not None:
            self.conv.bias.init = Init.zeros()
        self.norm = nn.BatchNorm2d(c_out) if norm else None
        self.residual = residual
        self.pool = nn.MaxPool2d(2, 2) if pooled else None

    def forward(self, x: Any) -> Any:
        z = self.conv(x)
        if self.norm is not None:
            z = self.norm(z)
        if self.residual:
            z = z + x
        h = nn.functional.relu(z)
        return self.pool(h) if self.pool is not None else h


class ConvNet(nn.Module):
    """The CNN family's network: ``blocks`` convolution blocks, then the dense layers."""

    def __init__(self, params: dict[str, Any], image: tuple[int, int, int], n_out: int
                 ) -> None:
        super().__init__()
        k = int(params["kernel"])
        if k < 1 or k % 2 == 0:
            raise BuildError(f"kernel must be odd (same padding), got {k}")
        stride = stride_of(params)
        channels = channels_of(params)
        norm = bool(params.get("batch_norm", False))
        self.image = image
        c, h, w = image
        blocks = []
        for width in channels:
            h, w = -(-h // stride), -(-w // stride)  # "same" padding: ceil(size / stride)
            pooled = bool(params.get("pool", True)) and h >= 2 and w >= 2
            residual = bool(params.get("residual", False)) and width == c and stride == 1
            blocks.append(ConvBlock(c, width, k, stride, norm, residual, pooled))
            c, h, w = width, (h // 2 if pooled else h), (w // 2 if pooled else w)
        self.blocks = nn.Sequential(*blocks)
        self.head = Dense(params, c * h * w, n_out)

    def forward(self, x: Any) -> Any:
        h = self.blocks(x.reshape(-1, *self.image))
        return self.head(h.flatten(1))


@register("cnn")
class CnnFamily(ModuleFamily):
    name = "cnn"

    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        return ConvNet(params, image_of(data, "cnn"), outputs)

    def check(self, model: Mapping[str, Any]) -> None:
        lowest = bounds(model["blocks"])[0]
        if not (isinstance(lowest, int) and lowest >= 1):
            raise ValueError("family cnn needs blocks of at least 1")
