"""How a sequence data set lays out its rows: :class:`SequenceShape`.

A run's rows are flat (``x`` is ``[n, features]``, float32 or uint8 pixels), whatever
the data; a sequence data set says how a row reads as a sequence so that a sequence
family (``transformer``, ``conv1d``) can reshape it:

- **features**: ``length`` steps of ``channels`` values, the row being ``[length,
  channels]`` flattened step by step; with ``masked``, every step carries one more
  value, last, that is 1.0 for a real step and 0.0 for padding (the row is then
  ``[length, channels + 1]``);
- **tokens**: ``channels`` is 1 and ``vocab`` is set: each step is a token id in
  ``0..vocab-1`` held exactly as float32 (ids below 2**24), the model casting it to an
  index; ``pad`` is the id that marks padding (masked out of attention), or None.

>>> s = SequenceShape(length=28, channels=28)
>>> s.features, s.step_width, s.tokens
(784, 28, False)
>>> SequenceShape(length=5, channels=2, masked=True).features
15
>>> SequenceShape(length=16, channels=1, vocab=100, pad=0).tokens
True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceShape:
    """A row as a sequence: ``length`` steps of ``channels`` values (see the module)."""

    length: int
    channels: int
    vocab: int | None = None  # tokens: ids 0..vocab-1; None: real-valued features
    pad: int | None = None  # tokens: the padding id, masked out; None: no padding
    masked: bool = False  # features: each step ends with a presence flag (1 real, 0 pad)

    def __post_init__(self) -> None:
        if self.length < 1 or self.channels < 1:
            raise ValueError(f"a sequence needs length and channels of at least 1, got "
                             f"{self.length} and {self.channels}")
        if self.vocab is not None:
            if self.channels != 1 or self.masked:
                raise ValueError("a token sequence has one id per step (channels 1) and "
                                 "marks padding with its pad id, not a presence flag")
            if self.vocab < 1 or not (self.pad is None or 0 <= self.pad < self.vocab):
                raise ValueError(f"pad {self.pad} is not an id of a vocabulary of "
                                 f"{self.vocab}")
        elif self.pad is not None:
            raise ValueError("pad is a token id: real-valued steps mark padding with "
                             "masked (a presence flag per step)")

    @property
    def tokens(self) -> bool:
        """Whether each step is a token id (an embedding's input)."""
        return self.vocab is not None

    @property
    def step_width(self) -> int:
        """Values per step in the row: ``channels``, and the presence flag if masked."""
        return self.channels + int(self.masked)

    @property
    def features(self) -> int:
        """Values per row: ``length * step_width``."""
        return self.length * self.step_width

    @property
    def padded(self) -> bool:
        """Whether some steps may be padding (a mask reaches attention and pooling)."""
        return self.masked or self.pad is not None
