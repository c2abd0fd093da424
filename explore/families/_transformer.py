"""The transformer family: a sequence's steps embedded to ``d_model`` (a linear map of a
step's values, or an embedding of its token id), positions added (``positional``:
``learned``, ``sinusoidal`` or ``none``), ``layers`` encoder layers of ``heads`` heads
with a feed-forward of ``ff_ratio * d_model`` units, GELU and ``dropout`` (pre- or
post-norm: ``norm``), then one vector per row (``pooling``: the ``mean`` of the real
steps, or a learned class token, ``cls``, read where it went in) into the dense head of
the MLP (``depth`` hidden layers; 0 for the output layer alone).

Padding steps (token id ``pad``, or a presence flag of 0) are masked out of attention as
keys and out of the mean; the attention scores, ``[batch, heads, length, length]`` per
layer, are planned buffers like any other, so the compiler's sizes and the packer see
what a longer sequence costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import Init, nn
from explore.datasets.sequence_shape import SequenceShape
from explore.families._base import AtKey, BuildError, DataShape, register
from explore.families.layers import Dense, ModuleFamily
from explore.families.sequences import SequenceInput, key_padding, masked_mean, sequence_of
from explore.ranges import bounds, values_of

POOLINGS = ("mean", "cls")
POSITIONALS = ("learned", "sinusoidal", "none")
NORMS = ("pre", "post")


class Transformer(nn.Module):
    """The transformer family's network (see the module)."""

    def __init__(self, params: Mapping[str, Any], seq: SequenceShape, n_out: int) -> None:
        super().__init__()
        d, heads, layers = int(params["d_model"]), int(params["heads"]), int(params["layers"])
        if d < 1 or heads < 1 or d % heads:
            raise BuildError(f"d_model {d} is not a multiple of heads {heads}")
        if layers < 1:
            raise BuildError(f"layers must be at least 1, got {layers}")
        ff = max(1, round(float(params["ff_ratio"]) * d))
        dropout = float(params.get("dropout", (params.get("dropouts") or [0.0])[0]))
        self.pooling = str(params["pooling"])
        positional = str(params["positional"])
        norm = str(params["norm"])
        for key, value, known in (("pooling", self.pooling, POOLINGS),
                                  ("positional", positional, POSITIONALS),
                                  ("norm", norm, NORMS)):
            if value not in known:
                raise BuildError(f"{key} {value!r} is not one of {', '.join(known)}")
        self.seq = seq
        self.inputs = SequenceInput(seq)
        self.embed: nn.Module = nn.Embedding(seq.vocab, d) if seq.tokens and seq.vocab \
            else nn.Linear(seq.channels, d)
        length = seq.length + (self.pooling == "cls")
        if self.pooling == "cls":
            self.cls = nn.Parameter(shape=(1, 1, d), init=Init.normal(0.0, 0.02))
        self.position: nn.Module | None = (
            nn.LearnedPositionalEmbedding(length, d) if positional == "learned"
            else nn.SinusoidalPositionalEncoding(d, max_len=length)
            if positional == "sinusoidal" else None)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=dropout,
                                           activation="gelu", batch_first=True,
                                           norm_first=norm == "pre")
        self.encoder = nn.TransformerEncoder(layer, layers,
                                             norm=nn.LayerNorm(d) if norm == "pre" else None)
        self.head = Dense(dict(params), d, n_out)

    def forward(self, x: Any) -> Any:
        steps, present = self.inputs(x)
        h = self.embed(steps.long() if self.seq.tokens else steps)
        if self.pooling == "cls":
            # the class token leads every row: a zero step (from the row, so that it is
            # batched) plus the learned token; it is never padding
            first = h[:, :1, :] * 0.0 + self.cls
            h = nn.cat([first, h], dim=1)
            if present is not None:
                present = nn.cat([present[:, :1] * 0.0 + 1.0, present], dim=1)
        if self.position is not None:
            h = self.position(h)
        h = self.encoder(h, src_key_padding_mask=key_padding(present))
        pooled = h[:, 0, :] if self.pooling == "cls" else masked_mean(h, present)
        return self.head(pooled)


@register("transformer")
class TransformerFamily(ModuleFamily):
    name = "transformer"
    keys = ("d_model", "heads", "layers", "ff_ratio", "pooling", "positional", "norm")
    scalar_keys = ("dropout",)

    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        return Transformer(params, sequence_of(data, "transformer"), outputs)

    def check(self, model: Mapping[str, Any]) -> None:
        if bounds(model["blocks"])[1] != 0:
            raise AtKey("blocks", "blocks are for families cnn and conv1d; a transformer "
                        "has layers")
        for key, known in (("pooling", POOLINGS), ("positional", POSITIONALS),
                           ("norm", NORMS)):
            for v in values_of(model[key]) or []:
                if v not in known:
                    raise AtKey(key, f"{v!r} is not a {key} of family transformer; one of "
                                f"{', '.join(known)}")
        widths, heads = values_of(model["d_model"]), values_of(model["heads"])
        if widths is not None and heads is not None:
            bad = [(d, h) for d in widths for h in heads if d % h]
            if bad:
                d, h = bad[0]
                raise AtKey("heads", f"d_model {d} is not a multiple of heads {h}: every "
                            "d_model the space can draw must split evenly into every heads")
