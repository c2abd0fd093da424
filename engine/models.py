"""Ready-made CalcGraphs used by the README, the benchmarks and the tests.

>>> g = paper_mlp()
>>> [p.name for p in g.paths]
['train', 'eval']
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from engine.graph import CalcGraph, Init, Mode, Var


def paper_mlp(
    sizes: Sequence[int] = (784, 64, 64, 10),
    activation: str = "Sigmoid",
    init: Init | None = None,
    dropout: float = 0.0,
    name: str = "paper_mlp",
) -> CalcGraph:
    """The CalcGraph paper's MNIST model: dense layers with biases, ``activation``
    between them, softmax + cross-entropy loss.  Paths: ``train`` (BACKWARD_ENABLED,
    loss) and ``eval`` (FORWARD_ONLY: ``accuracy`` of ``logits``)."""
    g = CalcGraph(name=name)
    x = g.placeholder("x", (0, sizes[0]))
    y = g.placeholder("y", (0,), dtype="int64")
    train = g.path("train", Mode.BACKWARD_ENABLED)
    h: Var = x
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = g.parameter(f"w{i}", (n_in, n_out), init=init or Init.xavier_uniform())
        b = g.parameter(f"b{i}", (n_out,), init=Init.zeros())
        last = i == len(sizes) - 2
        h = train.Gemm(h, w, b, outputs=["logits"] if last else 1)
        if not last:
            h = train.op(activation, h)
            if dropout:
                h = train.Dropout(h, ratio=dropout)
    loss, _ = train.SoftmaxCrossEntropyLoss(h, y, outputs=["loss", "log_prob"])
    train.set_loss(loss)
    ev = g.path("eval", Mode.FORWARD_ONLY)
    ev.Accuracy(h, y, outputs=["accuracy"])
    return g
