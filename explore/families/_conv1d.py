"""The conv1d family: ``blocks`` 1-D convolution blocks over a sequence's steps
(``channels[i]`` filters of ``kernel`` steps, "same" padding, the dilation growing as
``dilation ** i`` so that a few blocks see far back, as a temporal convolution network
does; optional batch norm, Relu, an optional residual add where the widths agree and
optional max pooling by 2), one vector per row (``readout``: the ``mean`` over the
steps left, the ``last`` step's features, or every step's, ``flatten``ed in order), then
the dense head of the MLP (``depth`` hidden layers).  Token sequences are embedded to
``d_model`` first.

The mean forgets where in the window a feature was, which suits a classification of a
whole sequence; a forecast hangs on the latest steps, which ``last`` (the features that
see back ``kernel`` x the dilations) and ``flatten`` (position by position: with
``depth: 0`` an autoregression on learned features) keep.

Padding steps (``masked`` features, or token id ``pad``) are zeros for the convolutions
and left out of the mean where no block pooled (pooling merges real steps with padding,
so after it the mean is over every step); ``last`` needs a sequence without padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import Init, nn
from explore.datasets.sequence_shape import SequenceShape
from explore.families._base import AtKey, BuildError, DataShape, register
from explore.families.layers import Dense, ModuleFamily, channels_of
from explore.families.sequences import SequenceInput, masked_mean, sequence_of
from explore.ranges import bounds, values_of

READOUTS = ("mean", "last", "flatten")


class Conv1dBlock(nn.Module):
    """Convolution ("same" padding, dilated), optional batch norm, optional residual
    add, Relu, optional max pooling by 2."""

    def __init__(self, c_in: int, c_out: int, k: int, dilation: int, norm: bool,
                 residual: bool, pooled: bool) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, k, padding=dilation * (k - 1) // 2,
                              dilation=dilation, bias=not norm)
        self.conv.weight.init = Init.he_uniform(fan_in=c_in * k)
        if self.conv.bias is not None:
            self.conv.bias.init = Init.zeros()
        self.norm = nn.BatchNorm1d(c_out) if norm else None
        self.residual = residual
        self.pool = nn.MaxPool1d(2, 2) if pooled else None

    def forward(self, x: Any) -> Any:
        z = self.conv(x)
        if self.norm is not None:
            z = self.norm(z)
        if self.residual:
            z = z + x
        h = nn.functional.relu(z)
        return self.pool(h) if self.pool is not None else h


class Conv1dNet(nn.Module):
    """The conv1d family's network (see the module)."""

    def __init__(self, params: Mapping[str, Any], seq: SequenceShape, n_out: int) -> None:
        super().__init__()
        k = int(params["kernel"])
        if k < 1 or k % 2 == 0:
            raise BuildError(f"kernel must be odd (same padding), got {k}")
        growth = int(params["dilation"])
        if growth < 1:
            raise BuildError(f"dilation must be at least 1, got {growth}")
        channels = channels_of(dict(params))
        norm = bool(params.get("batch_norm", False))
        self.readout = str(params.get("readout", "mean"))
        if self.readout not in READOUTS:
            raise BuildError(f"readout {self.readout!r} is not one of {', '.join(READOUTS)}")
        if self.readout == "last" and seq.padded:
            raise BuildError("readout last reads the final step, which padding may hide; "
                             "use mean or flatten for padded sequences")
        self.seq = seq
        self.inputs = SequenceInput(seq)
        c = seq.channels
        if seq.tokens and seq.vocab:
            c = int(params["d_model"])
            self.embed: nn.Module | None = nn.Embedding(seq.vocab, c)
        else:
            self.embed = None
        length = seq.length
        blocks = []
        self.pooled = False
        for i, width in enumerate(channels):
            pooled = bool(params.get("pool", True)) and length >= 2
            residual = bool(params.get("residual", False)) and width == c
            blocks.append(Conv1dBlock(c, width, k, growth ** i, norm, residual, pooled))
            self.pooled = self.pooled or pooled
            c, length = width, (length // 2 if pooled else length)
        self.blocks = nn.Sequential(*blocks)
        self.length = length
        self.head = Dense(dict(params), c * length if self.readout == "flatten" else c, n_out)

    def forward(self, x: Any) -> Any:
        steps, present = self.inputs(x)
        if self.embed is not None:
            steps = self.embed(steps.long())
        if present is not None:  # padding steps are zeros for the convolutions
            steps = steps * present.unsqueeze(2)
        h = self.blocks(steps.transpose(1, 2))  # [batch, channels, length]
        if self.readout == "last":
            return self.head(h[:, :, -1])
        if self.readout == "flatten":
            return self.head(h.transpose(1, 2).flatten(1))  # step by step
        h = h.transpose(1, 2)
        return self.head(masked_mean(h, None if self.pooled else present))


@register("conv1d")
class Conv1dFamily(ModuleFamily):
    name = "conv1d"
    keys = ("d_model", "dilation", "readout")

    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        return Conv1dNet(params, sequence_of(data, "conv1d"), outputs)

    def check(self, model: Mapping[str, Any]) -> None:
        lowest = bounds(model["blocks"])[0]
        if not (isinstance(lowest, int) and lowest >= 1):
            raise AtKey("blocks", "family conv1d needs blocks of at least 1")
        for v in values_of(model["readout"]) or []:
            if v not in READOUTS:
                raise AtKey("readout", f"{v!r} is not a readout of family conv1d; one of "
                            f"{', '.join(READOUTS)}")
