"""The built-in model families' networks, written with :mod:`engine.nn` (the one way a
model is built) and traced for the data set's task.

The MLP family: ``depth`` hidden dense layers of ``widths[i]`` units with
``activations[i]`` and ``dropouts[i]``, then a linear classifier and softmax
cross-entropy, or one linear output and a regression loss.  The CNN family puts
``blocks`` convolution blocks in front (convolution with "same" padding, optional batch
norm, Relu, optional residual add and 2x2 max pooling); the ResNet family a stem and
``blocks`` stages of ``stage_blocks`` residual blocks with batch norm, each stage
``channels[i]`` wide and the stages after the first downsampled by ``stride``, then
global average pooling.  :func:`engine.nn.to_graph` gives the paths ``train``
(BACKWARD_ENABLED, with dropout and batch statistics) and ``eval`` (FORWARD_ONLY, the
same layers without dropout, ending in what the task's metrics read); the planner lets
the two share their temporaries.  Parameters have PyTorch's names (``dense.0.weight``).

>>> g = build_graph({"depth": 2, "widths": [16, 8], "activations": ["relu", "tanh"],
...                  "dropouts": [0.1, 0.0], "init": "he_uniform"}, n_in=64, n_classes=10)
>>> [p.name for p in g.paths], g.outputs
(['train', 'eval'], ['loss', 'logits', 'accuracy', 'class_counts', 'eval_loss'])
>>> build_graph({"depth": 0, "widths": [], "activations": [], "dropouts": [],
...              "init": "he_uniform", "loss": "huber"}, n_in=8, n_classes=0,
...              task="regression").outputs
['loss', 'logits', 'regression_sums', 'eval_loss']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine import CalcGraph, Init, nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU}
# Dense weights' init by name, given the layer's fans (a Linear weight is [out, in]).
INITS: dict[str, Callable[[int, int], Init]] = {
    "xavier_uniform": lambda i, o: Init.xavier_uniform(fan_in=i, fan_out=o),
    "xavier_normal": lambda i, o: Init.xavier_normal(fan_in=i, fan_out=o),
    "he_uniform": lambda i, o: Init.he_uniform(fan_in=i),
    "he_normal": lambda i, o: Init.he_normal(fan_in=i),
    "lecun_normal": lambda i, o: Init.lecun_normal(fan_in=i),
    "normal": lambda i, o: Init.normal(0.0, 0.05),
    "uniform": lambda i, o: Init.uniform(-0.05, 0.05)}
LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "mae", "huber")}
REGRESSION_LOSS_OPS = {"mse": "MSELoss", "mae": "MAELoss", "huber": "HuberLoss"}


class BuildError(ValueError):
    """Parameters that do not make a model (an unknown activation, ...)."""


def build_graph(params: dict[str, Any], n_in: int, n_classes: int,
                eval_loss: bool = True, image: tuple[int, int, int] | None = None,
                pixel_scale: float | None = None, task: str = "classification",
                family: str | None = None) -> CalcGraph:
    """The model of ``params`` traced for ``task``: with ``blocks`` > 0 the CNN family
    (or, with ``family="resnet"``, the ResNet family) on rows viewed as ``image``
    (channels, height, width), else the MLP.  With ``pixel_scale`` the input ``x`` is
    uint8 pixels (a quarter of the bytes of float32, in the shared data set and per
    mini-batch) that the model dequantizes, ``x * pixel_scale``, as its first op (fused
    into the first layer by the compiler).  A classification ends in ``n_classes``
    logits and softmax cross-entropy against int64 labels ``y``; a regression in one
    output and ``params["loss"]`` (``mse``, ``mae`` or ``huber``) against a float32
    target.  The eval path's outputs are ``logits`` (what an exported model computes)
    and what the task's metrics read (:mod:`explore.metrics.evaluation`), with
    ``eval_loss`` unless ``eval_loss`` is False."""
    loss = task_loss(params, task)
    outputs = 1 if task == "regression" else n_classes
    blocks = int(params.get("blocks") or 0)
    if family == "resnet":
        net: nn.Module = ResNet(params, _image(image, "resnet"), outputs)
    elif blocks:
        net = ConvNet(params, _image(image, "cnn"), outputs)
    else:
        net = Mlp(params, n_in, outputs)
    return nn.to_graph(net, inputs={"x": ((0, n_in), "uint8" if pixel_scale else "float32")},
                       loss=loss, metrics=task_outputs(task, n_classes, eval_loss),
                       name=family or ("cnn" if blocks else "mlp"),
                       dequantize={"x": pixel_scale} if pixel_scale else None)


class Dense(nn.Module):
    """``depth`` hidden layers (Linear, activation, dropout) and the output layer; dense
    weights drawn by ``params["init"]``, biases zero."""

    def __init__(self, params: dict[str, Any], n_in: int, n_out: int) -> None:
        super().__init__()
        depth = int(params["depth"])
        widths = [int(w) for w in params["widths"]][:depth]
        if min(widths, default=1) < 1:
            raise BuildError(f"widths must be positive, got {params['widths']}")
        acts = [_activation(a) for a in params["activations"]]
        drops = [float(d) for d in params["dropouts"]]
        init = _init(params["init"])
        layers: list[nn.Module] = []
        sizes = [n_in, *widths]
        for i, width in enumerate(widths):
            layers += [_linear(sizes[i], width, init), acts[i]()]
            if drops[i] > 0:
                layers.append(nn.Dropout(drops[i]))
        self.dense = nn.Sequential(*layers)
        self.out = _linear(sizes[-1], n_out, init)

    def forward(self, x: Any) -> Any:
        return self.out(self.dense(x))


class Mlp(nn.Module):
    """The MLP family."""

    def __init__(self, params: dict[str, Any], n_in: int, n_out: int) -> None:
        super().__init__()
        self.head = Dense(params, n_in, n_out)

    def forward(self, x: Any) -> Any:
        return self.head(x)


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
    """The CNN family: ``blocks`` convolution blocks, then the dense layers."""

    def __init__(self, params: dict[str, Any], image: tuple[int, int, int], n_out: int
                 ) -> None:
        super().__init__()
        k = int(params["kernel"])
        if k < 1 or k % 2 == 0:
            raise BuildError(f"kernel must be odd (same padding), got {k}")
        stride = _stride(params)
        channels = _channels(params)
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
    """The ResNet family: a 3x3 stem with batch norm, ``blocks`` stages of
    ``stage_blocks`` basic blocks (stage ``i`` is ``channels[i]`` wide; every stage after
    the first starts with a stride of ``stride``), global average pooling and the dense
    layers."""

    def __init__(self, params: dict[str, Any], image: tuple[int, int, int], n_out: int
                 ) -> None:
        super().__init__()
        channels = _channels(params)
        stride = _stride(params)
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


def _linear(n_in: int, n_out: int, init: Callable[[int, int], Init]) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    layer.weight.init = init(n_in, n_out)
    if layer.bias is not None:
        layer.bias.init = Init.zeros()
    return layer


def _image(image: tuple[int, int, int] | None, family: str) -> tuple[int, int, int]:
    if image is None:
        raise BuildError(f"family {family} needs images (a data set with an image shape: "
                         "channels, height, width); this one is a table: use family mlp")
    return image


def _channels(params: dict[str, Any]) -> list[int]:
    blocks = int(params.get("blocks") or 0)
    channels = [int(c) for c in params["channels"]][:blocks]
    if not channels or min(channels) < 1:
        raise BuildError(f"channels must be positive, got {params['channels']}")
    return channels


def _stride(params: dict[str, Any]) -> int:
    stride = int(params.get("stride", 1))
    if stride < 1:
        raise BuildError(f"stride must be positive, got {stride}")
    return stride


def task_outputs(task: str, classes: int, eval_loss: bool = True) -> list[str]:
    """What a model's eval path gives for the task's metrics (engine.nn metric names;
    ``loss`` is the output ``eval_loss``).

    >>> task_outputs("classification", 2), task_outputs("regression", 0, eval_loss=False)
    (['accuracy', 'class_counts', 'positive_score', 'loss'], ['regression_sums'])
    """
    if task == "regression":
        stats = ["regression_sums"]
    else:
        stats = ["accuracy", "class_counts", *(["positive_score"] if classes == 2 else [])]
    return [*stats, *(["loss"] if eval_loss else [])]


def task_loss(params: Mapping[str, Any], task: str) -> str:
    """The loss ``params["loss"]`` names for ``task`` (auto: cross-entropy for a
    classification, mse for a regression); BuildError for one that does not suit it.

    >>> task_loss({"loss": "auto"}, "regression"), task_loss({}, "classification")
    ('mse', 'cross_entropy')
    """
    if task not in LOSSES:
        raise BuildError(f"unknown task {task!r}; known: {', '.join(LOSSES)}")
    name = str(params.get("loss") or "auto").lower()
    if name == "auto":
        name = LOSSES[task][0]
    if name not in LOSSES[task]:
        raise BuildError(f"loss {name!r} does not suit a {task}; use "
                         f"{' or '.join(LOSSES[task])}")
    return name


def _activation(name: Any) -> Callable[[], nn.Module]:
    try:
        return ACTIVATIONS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") \
            from None


def _init(name: Any) -> Callable[[int, int], Init]:
    try:
        return INITS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown init {name!r}; known: {', '.join(INITS)}") from None
