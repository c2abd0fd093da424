"""What the built-in families build with: :class:`ModuleFamily` (a family whose network
is an :mod:`engine.nn` module) and the layers they share, the dense head
(:class:`Dense`) and the named activations and initialisations the search space
offers.  Parameters have PyTorch's names (``dense.0.weight``).

>>> d = Dense({"depth": 1, "widths": [8], "activations": ["relu"], "dropouts": [0.0],
...            "init": "he_uniform"}, n_in=4, n_out=3)
>>> [name for name, _ in d.named_parameters()]
['dense.0.weight', 'dense.0.bias', 'out.weight', 'out.bias']
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from engine import CalcGraph, Init, nn
from explore.families._base import BaseFamily, BuildError, DataShape
from explore.families.tasks import outputs_of, task_loss, task_of, trace

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


class ModuleFamily(BaseFamily):
    """A family whose network is an :mod:`engine.nn` module: it says how to make the
    module (:meth:`network`); the family traces it for the task
    (:func:`~explore.families.tasks.trace`), the graph named after the family."""

    name: str

    @abstractmethod
    def network(self, params: dict[str, Any], data: DataShape, outputs: int) -> nn.Module:
        """The network of ``params`` for rows of ``data``, ending in ``outputs`` values
        per row (raises :class:`~explore.families.BuildError`)."""

    def build(self, params: dict[str, Any], data: DataShape,
              eval_loss: bool = True) -> CalcGraph:
        task_loss(params, task_of(data))  # a loss that does not suit the task: said first
        return trace(self.network(params, data, outputs_of(data)), data, params,
                     eval_loss=eval_loss, name=self.name)


class Dense(nn.Module):
    """``depth`` hidden layers (Linear, activation, dropout) and the output layer; dense
    weights drawn by ``params["init"]``, biases zero."""

    def __init__(self, params: dict[str, Any], n_in: int, n_out: int) -> None:
        super().__init__()
        depth = int(params["depth"])
        widths = [int(w) for w in params["widths"]][:depth]
        if min(widths, default=1) < 1:
            raise BuildError(f"widths must be positive, got {params['widths']}")
        acts = [activation(a) for a in params["activations"]]
        drops = [float(d) for d in params["dropouts"]]
        init = initialiser(params["init"])
        layers: list[nn.Module] = []
        sizes = [n_in, *widths]
        for i, width in enumerate(widths):
            layers += [linear(sizes[i], width, init), acts[i]()]
            if drops[i] > 0:
                layers.append(nn.Dropout(drops[i]))
        self.dense = nn.Sequential(*layers)
        self.out = linear(sizes[-1], n_out, init)

    def forward(self, x: Any) -> Any:
        return self.out(self.dense(x))


def linear(n_in: int, n_out: int, init: Callable[[int, int], Init]) -> nn.Linear:
    """A Linear layer, its weight drawn by ``init(fan_in, fan_out)``, its bias zero."""
    layer = nn.Linear(n_in, n_out)
    layer.weight.init = init(n_in, n_out)
    if layer.bias is not None:
        layer.bias.init = Init.zeros()
    return layer


def image_of(data: DataShape, family: str) -> tuple[int, int, int]:
    """``data``'s image shape (channels, height, width); BuildError for a table."""
    image = getattr(data, "image", None)
    if image is None:
        raise BuildError(f"family {family} needs images (a data set with an image shape: "
                         "channels, height, width); this one is a table: use family mlp")
    return (int(image[0]), int(image[1]), int(image[2]))


def channels_of(params: dict[str, Any]) -> list[int]:
    """The widths of the first ``blocks`` convolution blocks (or stages)."""
    blocks = int(params.get("blocks") or 0)
    channels = [int(c) for c in params["channels"]][:blocks]
    if not channels or min(channels) < 1:
        raise BuildError(f"channels must be positive, got {params['channels']}")
    return channels


def stride_of(params: dict[str, Any]) -> int:
    stride = int(params.get("stride", 1))
    if stride < 1:
        raise BuildError(f"stride must be positive, got {stride}")
    return stride


def activation(name: Any) -> Callable[[], nn.Module]:
    """The activation module ``name`` makes (BuildError listing the known ones)."""
    try:
        return ACTIVATIONS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") \
            from None


def initialiser(name: Any) -> Callable[[int, int], Init]:
    """The dense weights' initialisation ``name`` (BuildError listing the known ones)."""
    try:
        return INITS[str(name).lower()]
    except KeyError:
        raise BuildError(f"unknown init {name!r}; known: {', '.join(INITS)}") from None
