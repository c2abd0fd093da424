"""Ready-made CalcGraphs used by the README, the benchmarks and the tests.

>>> g = paper_mlp()
>>> [p.name for p in g.paths]
['train', 'eval']
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from engine.graph import CalcGraph, Init, Mode, Path, Var


def paper_mlp(
    sizes: Sequence[int] = (784, 64, 64, 10),
    activation: str = "Sigmoid",
    init: Init | None = None,
    dropout: float = 0.0,
    name: str = "paper_mlp",
    train: bool = True,
) -> CalcGraph:
    """The CalcGraph paper's MNIST model: dense layers with biases, ``activation``
    between them, softmax + cross-entropy loss.  Paths: ``train`` (BACKWARD_ENABLED,
    loss) and ``eval`` (FORWARD_ONLY: ``accuracy`` of ``logits``).  With dropout the
    eval path computes its own logits, without it (``eval_logits``); without dropout
    it reads the train path's, as the paper's post path does.

    ``train=False`` gives the inference graph: one FORWARD_ONLY path ``infer`` from
    ``x`` to the class probabilities ``probs``."""
    g = CalcGraph(name=name)
    x = g.placeholder("x", (0, sizes[0]))
    if not train:
        infer = g.path("infer", Mode.FORWARD_ONLY)
        logits = _dense_stack(g, infer, x, sizes, activation, init, "Gemm")
        infer.Softmax(logits, outputs=["probs"])
        return g
    y = g.placeholder("y", (0,), dtype="int64")
    train_path = g.path("train", Mode.BACKWARD_ENABLED)
    h = _dense_stack(g, train_path, x, sizes, activation, init, "Gemm", dropout)
    loss, _ = train_path.SoftmaxCrossEntropyLoss(h, y, outputs=["loss", "log_prob"])
    train_path.set_loss(loss)
    ev = g.path("eval", Mode.FORWARD_ONLY)
    if dropout:  # evaluation never applies a training-time mask
        h = _dense_stack(g, ev, x, sizes, activation, init, "Gemm", logits="eval_logits")
    ev.Accuracy(h, y, outputs=["accuracy"])
    return g


def _dense_stack(g: CalcGraph, path: Path, x: Var, sizes: Sequence[int], activation: str,
                 init: Init | None, form: str, dropout: float = 0.0,
                 logits: str = "logits") -> Var:
    """Dense layers ``x -> ... -> logits``; ``form`` "Gemm" (one op per layer) or
    "MatMul" (MatMul + Add, as exporters often write it).  The parameters ``w{i}`` and
    ``b{i}`` are declared on first use and shared by later stacks."""
    h = x
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        if f"w{i}" in g.variables:
            w, b = Var(f"w{i}"), Var(f"b{i}")
        else:
            w = g.parameter(f"w{i}", (n_in, n_out), init=init or Init.xavier_uniform())
            b = g.parameter(f"b{i}", (n_out,), init=Init.zeros())
        last = i == len(sizes) - 2
        name = [logits] if last else 1
        if form == "Gemm":
            h = path.Gemm(h, w, b, outputs=name)
        else:
            h = path.Add(path.MatMul(h, w), b, outputs=name)
        if not last:
            h = path.op(activation, h)
            if dropout:
                h = path.Dropout(h, ratio=dropout)
    return h


def deep_mlp(depth: int = 20, width: int = 256, n_in: int = 784, n_out: int = 10,
             activation: str = "Relu") -> CalcGraph:
    """A ``depth``-layer classifier written as MatMul + Add + activation per layer
    (what an ONNX export looks like), with the paper MLP's paths and names.

    >>> len(deep_mlp(depth=3).paths[0].nodes)
    9
    """
    g = CalcGraph(name=f"mlp{depth}")
    x = g.placeholder("x", (0, n_in))
    y = g.placeholder("y", (0,), dtype="int64")
    train = g.path("train", Mode.BACKWARD_ENABLED)
    sizes = (n_in, *([width] * (depth - 1)), n_out)
    h = _dense_stack(g, train, x, sizes, activation, Init.he_uniform(), "MatMul")
    loss, _ = train.SoftmaxCrossEntropyLoss(h, y, outputs=["loss", "log_prob"])
    train.set_loss(loss)
    g.path("eval", Mode.FORWARD_ONLY).Accuracy(h, y, outputs=["accuracy"])
    return g


def chain_graph(nodes: int = 10_000, width: int = 64, pool: int = 8) -> CalcGraph:
    """A generated inference chain of ``nodes`` ops: repeated MatMul, bias Add, Tanh
    and a reshape round trip, over a pool of shared weights.

    >>> len(chain_graph(nodes=10).paths[0].nodes)
    10
    """
    g = CalcGraph(name=f"chain{nodes}")
    h = g.placeholder("x", (0, width))
    ws = [g.parameter(f"w{i}", (width, width), init=Init.normal(0.0, 1.0 / width ** 0.5))
          for i in range(pool)]
    bs = [g.parameter(f"b{i}", (width,), init=Init.zeros()) for i in range(pool)]
    p = g.path("infer", Mode.FORWARD_ONLY)
    unit = ("MatMul", "Add", "Tanh", "Reshape", "Reshape")
    for i in range(nodes):
        op, k = unit[i % len(unit)], (i // len(unit)) % pool
        if op == "MatMul":
            h = p.MatMul(h, ws[k])
        elif op == "Add":
            h = p.Add(h, bs[k])
        elif op == "Tanh":
            h = p.Tanh(h)
        else:
            h = p.Reshape(h, shape=(0, 8, width // 8) if i % 5 == 3 else (0, width))
    return g


def branching_graph(nodes: int = 10_000, width: int = 32, pool: int = 8,
                    train: bool = False) -> CalcGraph:
    """A generated residual network of ``nodes`` forward ops: each block splits into
    a Relu branch and a Tanh branch, multiplies them and adds the block's input back
    (6 ops a block).  ``train=True`` adds a mean-square loss against placeholder
    ``t`` and makes the path BACKWARD_ENABLED.

    >>> len(branching_graph(nodes=14).paths[0].nodes)
    14
    """
    g = CalcGraph(name=f"branching{nodes}" + ("_train" if train else ""))
    h = g.placeholder("x", (0, width))
    ws = [g.parameter(f"w{i}", (width, width), init=Init.normal(0.0, 0.1)) for i in range(pool)]
    bs = [g.parameter(f"b{i}", (width,), init=Init.zeros()) for i in range(pool)]
    p = g.path("train" if train else "infer",
               Mode.BACKWARD_ENABLED if train else Mode.FORWARD_ONLY)
    blocks, rest = divmod(nodes - int(train), 6)
    for i in range(blocks):
        k = i % pool
        a = p.Relu(p.Gemm(h, ws[k], bs[k]))
        c = p.Tanh(p.Gemm(h, ws[(k + 1) % pool]))
        h = p.Add(h, p.Mul(a, c))
    for _ in range(rest):
        h = p.Tanh(h)
    if train:
        p.set_loss(p.MSELoss(h, g.placeholder("t", (0, width))))
    return g


def mnist_cnn(channels: tuple[int, int] = (8, 16), algorithm: str | None = None) -> CalcGraph:
    """A small convolutional network for 28x28 digits fed as rows of 784: two blocks of
    3x3 convolution (padding 1, computed by ``algorithm``: see
    :mod:`engine.ops.conv_algorithms`; None leaves Conv's default, im2col, which an
    auto-tuner may replace), Relu and 2x2 max pooling, then a linear classifier.  Paths
    ``train`` (loss) and ``eval`` (``eval_logits``, ``accuracy``), sharing weights.

    >>> [p.name for p in mnist_cnn().paths]
    ['train', 'eval']
    """
    c1, c2 = channels
    g = CalcGraph(name="mnist_cnn")
    x = g.placeholder("x", (0, 784))
    y = g.placeholder("y", (0,), dtype="int64")
    w1 = g.parameter("w1", (c1, 1, 3, 3), init=Init.he_uniform())
    b1 = g.parameter("b1", (c1,), init=Init.zeros())
    w2 = g.parameter("w2", (c2, c1, 3, 3), init=Init.he_uniform())
    b2 = g.parameter("b2", (c2,), init=Init.zeros())
    w3 = g.parameter("w3", (c2 * 49, 10), init=Init.xavier_uniform())
    b3 = g.parameter("b3", (10,), init=Init.zeros())
    for name, mode in (("train", Mode.BACKWARD_ENABLED), ("eval", Mode.FORWARD_ONLY)):
        p = g.path(name, mode)
        h = p.Reshape(x, shape=(0, 1, 28, 28))
        for w, b in ((w1, b1), (w2, b2)):
            conv = p.Conv(h, w, b, pads=(1, 1, 1, 1),
                          **({"algorithm": algorithm} if algorithm else {}))
            h = p.MaxPool(p.Relu(conv), kernel_shape=(2, 2), strides=(2, 2))
        logits = p.Gemm(p.Flatten(h), w3, b3,
                        outputs=["logits" if name == "train" else "eval_logits"])
        if name == "train":
            loss, _ = p.SoftmaxCrossEntropyLoss(logits, y, outputs=["loss", "log_prob"])
            p.set_loss(loss)
        else:
            p.Accuracy(logits, y, outputs=["accuracy"])
    g.output("loss", "accuracy", "eval_logits")
    return g
