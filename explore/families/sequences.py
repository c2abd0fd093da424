"""What the sequence families (``transformer``, ``conv1d``) share: a flat row read as a
sequence, with which steps are padding (:class:`SequenceInput`), and the pooling of a
sequence of vectors into one per row that skips the padding (:func:`masked_mean`).

A row arrives flat (``x`` is ``[batch, features]``); its
:class:`~explore.datasets.sequence_shape.SequenceShape` says how it reads: steps of
real values (``[batch, length, channels]``), token ids (``[batch, length]``, embedded by
the family), and whether some steps are padding.  Padding is known from the values
alone, with arithmetic:
a token step is padding where its id equals ``pad`` (ids are whole numbers, so
``min(|id - pad|, 1)`` is 1 for a real step and 0 for padding), a feature step where its
presence flag is 0.

>>> from explore.datasets.sequence_shape import SequenceShape
>>> from explore.families import Shape
>>> sequence_of(Shape(features=784, classes=10, sequence=SequenceShape(28, 28)), "conv1d")
SequenceShape(length=28, channels=28, vocab=None, pad=None, masked=False)
"""

from __future__ import annotations

from typing import Any

from engine import nn
from explore.datasets.sequence_shape import SequenceShape
from explore.families._base import BuildError, DataShape

# Added to the attention scores of a padded key: exp() of it is 0 in float32 once the
# row's maximum is taken off, as exp(-inf) is, without the NaN that -inf * 0 gives.
MASKED = -1e9


def sequence_of(data: DataShape, family: str) -> SequenceShape:
    """``data``'s sequence layout; BuildError for a table or an image set."""
    seq = getattr(data, "sequence", None)
    if seq is None:
        kind = "images" if getattr(data, "image", None) else "a table"
        raise BuildError(f"family {family} needs sequences (a data set with a sequence "
                         f"shape: mnist_rows, kind: series or kind: sequences); this one is "
                         f"{kind}: use family " + ("cnn" if kind == "images" else "mlp"))
    if int(data.features) != seq.features:
        raise BuildError(f"the data set's rows have {data.features} values, and its sequence "
                         f"shape {seq.length} x {seq.step_width} needs {seq.features}")
    return seq


class SequenceInput(nn.Module):
    """A flat row as ``(steps, present)``: ``steps`` ``[batch, length, channels]`` of
    values (token ids ``[batch, length]`` for a token sequence), ``present``
    ``[batch, length]``, 1.0 for a real step and 0.0 for padding (None when the data
    has no padding)."""

    def __init__(self, seq: SequenceShape) -> None:
        super().__init__()
        self.seq = seq

    def forward(self, x: Any) -> tuple[Any, Any]:
        seq = self.seq
        if seq.tokens:
            ids = x.reshape(-1, seq.length)
            if seq.pad is None:
                return ids, None
            return ids, (ids - float(seq.pad)).abs().clamp(max=1.0)
        steps = x.reshape(-1, seq.length, seq.step_width)
        if not seq.masked:
            return steps, None
        return steps[:, :, :seq.channels], steps[:, :, seq.channels]


def masked_mean(h: Any, present: Any) -> Any:
    """The mean over axis 1 of ``h`` ``[batch, length, width]``, over the real steps
    only when ``present`` (``[batch, length]``) is given."""
    if present is None:
        return h.mean(1)
    weights = present.unsqueeze(2)
    return (h * weights).sum(1) / weights.sum(1)


def key_padding(present: Any) -> Any:
    """``present`` as the additive key-padding mask of attention: 0 for a real step,
    :data:`MASKED` for padding (None when there is no padding)."""
    return None if present is None else (present - 1.0) * (-MASKED)
