"""Layers: sampled parameters -> a CalcGraph, shared by the model families
(:mod:`explore.families`; the optimizers are :mod:`explore.optimizers`).

The MLP family: ``depth`` hidden dense layers of ``widths[i]`` units with
``activations[i]`` and ``dropouts[i]``, then a linear classifier and softmax
cross-entropy, or one linear output and a regression loss.  Paths: ``train``
(BACKWARD_ENABLED, with dropout) and ``eval`` (FORWARD_ONLY, the same layers without
dropout, ending in what the task's metrics read): evaluation never applies a
training-time dropout mask, and the planner lets the two paths share their
temporaries.

>>> g = build_graph({"depth": 2, "widths": [16, 8], "activations": ["relu", "tanh"],
...                  "dropouts": [0.1, 0.0], "init": "he_uniform"}, n_in=64, n_classes=10)
>>> [p.name for p in g.paths], g.outputs
(['train', 'eval'], ['loss', 'accuracy', 'class_counts', 'eval_loss'])
>>> build_graph({"depth": 0, "widths": [], "activations": [], "dropouts": [],
...              "init": "he_uniform", "loss": "huber"}, n_in=8, n_classes=0,
...              task="regression").outputs
['loss', 'regression_sums', 'eval_loss']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import CalcGraph, Init, Mode

ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "leaky_relu": "LeakyRelu",
               "elu": "Elu"}
INITS = {"xavier_uniform": Init.xavier_uniform, "xavier_normal": Init.xavier_normal,
         "he_uniform": Init.he_uniform, "he_normal": Init.he_normal,
         "lecun_normal": Init.lecun_normal, "normal": lambda: Init.normal(0.0, 0.05),
         "uniform": lambda: Init.uniform(-0.05, 0.05)}


class BuildError(ValueError):
    """Parameters that do not make a model (an unknown activation, ...)."""


LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "mae", "huber")}
REGRESSION_LOSS_OPS = {"mse": "MSELoss", "mae": "MAELoss", "huber": "HuberLoss"}


def build_graph(params: dict[str, Any], n_in: int, n_classes: int,
                eval_loss: bool = True, image: tuple[int, int, int] | None = None,
                pixel_scale: float | None = None, task: str = "classification") -> CalcGraph:
    """The model of ``params``: with ``blocks`` > 0 (the CNN family) the input rows are
    viewed as ``image`` (channels, height, width) and go through that many blocks of
    convolution (``kernel``, "same" padding), Relu and, with ``pool``, 2x2 max pooling,
    before the dense layers.  With ``pixel_scale`` the input ``x`` is uint8 pixels (a
    quarter of the bytes of float32, in the shared data set and per mini-batch) that
    the model dequantizes, ``x * pixel_scale``, as its first op.

    A classification ends in ``n_classes`` scores and softmax cross-entropy against
    int64 labels ``y``; a regression in one output and ``params["loss"]`` (``mse``,
    ``mae`` or ``huber``) against a float32 target ``y``.  The eval path's last layer
    is named ``logits`` (what an exported model computes), and it ends in the ops the
    metrics read (:mod:`explore.metrics.evaluation`): ``accuracy``, ``class_counts``
    and, for two classes, ``positive_score``; or ``regression_sums``; and
    ``eval_loss`` unless ``eval_loss`` is False."""
    if task not in LOSSES:
        raise BuildError(f"unknown task {task!r}; known: {', '.join(LOSSES)}")
    loss_name = str(params.get("loss") or "auto").lower()
    if loss_name == "auto":
        loss_name = LOSSES[task][0]
    if loss_name not in LOSSES[task]:
        raise BuildError(f"loss {loss_name!r} does not suit a {task}; use "
                         f"{' or '.join(LOSSES[task])}")
    regression = task == "regression"
    depth = int(params["depth"])
    blocks = int(params.get("blocks") or 0)
    widths = [int(w) for w in params["widths"]]
    acts = [_activation(a) for a in params["activations"]]
    drops = [float(d) for d in params["dropouts"]]
    if min(widths, default=1) < 1:
        raise BuildError(f"widths must be positive, got {widths}")
    init = _init(params["init"])
    g = CalcGraph(name="cnn" if blocks else "mlp")
    x = g.placeholder("x", (0, n_in), dtype="uint8" if pixel_scale else "float32")
    y = g.placeholder("y", (0,), dtype="float32" if regression else "int64")
    convs, shape = _conv_params(g, params, blocks, image, init)
    flat = shape[0] * shape[1] * shape[2] if blocks else n_in
    sizes = [flat, *widths[:depth], 1 if regression else n_classes]
    layers = []
    for i in range(len(sizes) - 1):
        w = g.parameter(f"w{i}", (sizes[i], sizes[i + 1]), init=init())
        b = g.parameter(f"b{i}", (sizes[i + 1],), init=Init.zeros())
        layers.append((w, b))
    train = g.path("train", Mode.BACKWARD_ENABLED)
    ev = g.path("eval", Mode.FORWARD_ONLY)
    outs: dict[bool, tuple[Any, Any]] = {}
    for path, training in ((train, True), (ev, False)):
        h = path.DequantizeLinear(x, scale=pixel_scale) if pixel_scale else x
        if blocks:
            assert image is not None
            h = path.Reshape(h, shape=(0, *image))
            for blk in convs:
                k = g.variables[blk.weight.name].desc.shape[-1]  # type: ignore[union-attr]
                bias = () if blk.bias is None else (blk.bias,)
                z = path.Conv(h, blk.weight, *bias, pads=(k // 2,) * 4,
                              strides=(blk.stride,) * 2)
                if blk.norm is not None:  # batch statistics in training, running ones else
                    z = path.BatchNormalization(z, *blk.norm, training_mode=int(training),
                                                running_update=int(training))
                if blk.residual:
                    z = path.Add(z, h)
                h = path.Relu(z)
                if blk.pooled:
                    h = path.MaxPool(h, kernel_shape=(2, 2), strides=(2, 2))
            h = path.Flatten(h)
        for i, (w, b) in enumerate(layers):
            last = i == len(layers) - 1
            h = path.Gemm(h, w, b, **({"outputs": ["logits"]} if last and not training
                                      else {}))
            if i < depth:
                h = path.op(acts[i], h)
                if training and drops[i] > 0:
                    h = path.Dropout(h, ratio=drops[i])
        if regression:
            h = path.Reshape(h, shape=(0,))  # [b, 1] -> [b], as the target
        loss = None
        if training or eval_loss:
            name = "loss" if training else "eval_loss"
            if regression:
                loss = path.op(REGRESSION_LOSS_OPS[loss_name], h, y, outputs=[name])
            else:
                loss, _ = path.SoftmaxCrossEntropyLoss(
                    h, y, outputs=[name, "log_prob" if training else "eval_log_prob"])
        outs[training] = (h, loss)
    train.set_loss(outs[True][1])
    scores = outs[False][0]
    if regression:
        stats = [ev.RegressionSums(scores, y, outputs=["regression_sums"])]
    else:
        stats = [ev.Accuracy(scores, y, outputs=["accuracy"]),
                 ev.ClassCounts(scores, y, outputs=["class_counts"])]
        if n_classes == 2:
            stats.append(ev.PositiveScore(scores, outputs=["positive_score"]))
    # Declared outputs: without eval_loss, dead-code elimination drops its loss.
    g.output(outs[True][1], *stats, *([outs[False][1]] if eval_loss else []))
    return g


@dataclass
class ConvBlock:
    """One convolution block's parameters: conv (bias only without batch norm), batch
    norm's scale, shift and running statistics, whether it pools and adds its input."""

    weight: Any
    bias: Any | None
    norm: tuple[Any, Any, Any, Any] | None
    pooled: bool
    residual: bool
    stride: int = 1


def _conv_params(g: CalcGraph, params: dict[str, Any], blocks: int,
                 image: tuple[int, int, int] | None, init: Any
                 ) -> tuple[list[ConvBlock], tuple[int, int, int]]:
    """The convolution blocks and the output shape."""
    if not blocks:
        return [], (0, 0, 0)
    if image is None:
        raise BuildError("family cnn needs images (a data set with an image shape: "
                         "channels, height, width); this one is a table: use family mlp")
    k = int(params["kernel"])
    if k < 1 or k % 2 == 0:
        raise BuildError(f"kernel must be odd (same padding), got {k}")
    channels = [int(c) for c in params["channels"]]
    norm = bool(params.get("batch_norm", False))
    stride = int(params.get("stride", 1))
    if stride < 1:
        raise BuildError(f"stride must be positive, got {stride}")
    c, h, w = image
    out = []
    for i, width in enumerate(channels[:blocks]):
        if width < 1:
            raise BuildError(f"channels must be positive, got {channels}")
        wt = g.parameter(f"conv{i}", (width, c, k, k), init=Init.he_uniform())
        # batch norm's shift makes a convolution bias redundant
        bs = None if norm else g.parameter(f"conv{i}_b", (width,), init=Init.zeros())
        bn = None
        if norm:
            bn = (g.parameter(f"bn{i}_scale", (width,), init=Init.ones()),
                  g.parameter(f"bn{i}_shift", (width,), init=Init.zeros()),
                  g.parameter(f"bn{i}_mean", (width,), init=Init.zeros(), trainable=False),
                  g.parameter(f"bn{i}_var", (width,), init=Init.ones(), trainable=False))
        h, w = -(-h // stride), -(-w // stride)  # "same" padding: ceil(size / stride)
        pooled = bool(params.get("pool", True)) and h >= 2 and w >= 2
        out.append(ConvBlock(wt, bs, bn, pooled, bool(params.get("residual", False)) and
                             width == c and stride == 1, stride))
        c, h, w = width, (h // 2 if pooled else h), (w // 2 if pooled else w)
    return out, (c, h, w)


def _activation(name: Any) -> str:
    try:
        return ACTIVATIONS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") \
            from None


def _init(name: Any) -> Any:
    try:
        return INITS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown init {name!r}; known: {', '.join(INITS)}") from None
