"""Optimizers: pure-data specs (part of a compiled :class:`~engine.program.Program`,
since their state is sized into the optimizer zone) and the kernels that apply them.

The update follows PyTorch's formulas (Adam's and RMSProp's running averages are
stored scaled by a constant, which saves passes; the parameters come out the same to
rounding).  Trainable parameters are laid out
contiguously in the forward zone, their gradients identically in the gradient zone,
and each state slot identically in the optimizer zone, so one update touches every
parameter with a handful of vectorised calls over one flat region.

>>> from engine.optim import Adam, optimizer_from_dict
>>> Adam(lr=0.01).state_slots
2
>>> optimizer_from_dict({"name": "SGD", "lr": 0.1, "momentum": 0.9}).state_slots
1
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

Step = Callable[[], None]


@dataclass(frozen=True)
class Optimizer:
    """Base of the optimizer specs."""

    lr: float = 1e-3

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def state_slots(self) -> int:
        """Copies of the parameter region it keeps in the optimizer zone."""
        return 0

    def state_init(self) -> tuple[float, ...]:
        """The value each state slot starts from."""
        return (0.0,) * self.state_slots

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int]) -> Step:
        """A step updating ``p`` from ``g``; ``state`` are its slots, ``s`` a scratch of the
        same shape, ``t`` a one-element step counter shared by the program."""
        raise NotImplementedError


def _add_scaled(xp: Any, dst: Any, src: Any, coef: float, s: Any) -> None:
    """dst += coef * src, through the scratch ``s``."""
    xp.multiply(src, coef, out=s)
    xp.add(dst, s, out=dst)


def _heavy_ball(xp: Any, buf: Any, direction: Any, mu: float) -> None:
    """buf = mu * buf + direction: the momentum shared by SGD and RMSProp."""
    xp.multiply(buf, mu, out=buf)
    xp.add(buf, direction, out=buf)


@dataclass(frozen=True)
class SGD(Optimizer):
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    @property
    def state_slots(self) -> int:
        return 1 if self.momentum else 0

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int]) -> Step:
        lr, mu, wd, nesterov = self.lr, self.momentum, self.weight_decay, self.nesterov
        buf = state[0] if mu else None

        def step() -> None:
            # The gradient has been consumed once the update is done, so weight decay
            # folds into it in place: g += wd * p.
            if wd:
                _add_scaled(xp, g, p, wd, s)
            if buf is None:
                xp.multiply(g, lr, out=s)
            else:
                _heavy_ball(xp, buf, g, mu)
                if nesterov:  # p -= lr * (g + mu * buf)
                    xp.multiply(g, lr, out=s)
                    xp.subtract(p, s, out=p)
                    xp.multiply(buf, mu * lr, out=s)
                else:
                    xp.multiply(buf, lr, out=s)
            xp.subtract(p, s, out=p)

        return step


@dataclass(frozen=True)
class Adam(Optimizer):
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0  # L2 added to the gradient (Adam); decoupled in AdamW

    decoupled: bool = field(default=False, init=False, repr=False)

    @property
    def state_slots(self) -> int:
        return 2

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int]) -> Step:
        # The slots hold PyTorch's m and v divided by (1 - beta1) and (1 - beta2):
        # m' = beta1 m' + g and v' = beta2 v' + g^2 take one pass fewer each, and the
        # constants fold into the update (10 passes over the region instead of 13).
        m, v = state
        lr, b1, b2, eps, wd = self.lr, self.beta1, self.beta2, self.eps, self.weight_decay
        decoupled = self.decoupled

        def step() -> None:
            n = t[0]
            if wd and decoupled:
                xp.multiply(p, 1.0 - lr * wd, out=p)
            elif wd:
                _add_scaled(xp, g, p, wd, s)
            xp.multiply(m, b1, out=m)
            xp.add(m, g, out=m)
            xp.multiply(v, b2, out=v)
            xp.multiply(g, g, out=s)
            xp.add(v, s, out=v)
            # p -= lr/bc1 * m / (sqrt(v/bc2) + eps), with m = (1-b1) m', v = (1-b2) v'
            k = math.sqrt((1.0 - b2) / (1.0 - b2**n))
            xp.sqrt(v, out=s)
            xp.add(s, eps / k, out=s)
            xp.divide(m, s, out=s)
            xp.multiply(s, lr * (1.0 - b1) / ((1.0 - b1**n) * k), out=s)
            xp.subtract(p, s, out=p)

        return step


@dataclass(frozen=True)
class AdamW(Adam):
    weight_decay: float = 0.01
    decoupled: bool = field(default=True, init=False, repr=False)


@dataclass(frozen=True)
class RMSProp(Optimizer):
    lr: float = 0.01
    alpha: float = 0.99
    eps: float = 1e-8
    momentum: float = 0.0

    @property
    def state_slots(self) -> int:
        return 2 if self.momentum else 1

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int]) -> Step:
        # The square average is kept divided by (1 - alpha): one pass fewer (see Adam).
        sq = state[0]
        buf = state[1] if self.momentum else None
        lr, alpha, eps, mu = self.lr, self.alpha, self.eps, self.momentum
        k = math.sqrt(1.0 - alpha)

        def step() -> None:
            xp.multiply(sq, alpha, out=sq)
            xp.multiply(g, g, out=s)
            xp.add(sq, s, out=sq)
            # g / (sqrt(sq) + eps) with sq = (1 - alpha) sq' is g / (k (sqrt(sq') + eps / k))
            xp.sqrt(sq, out=s)
            xp.add(s, eps / k, out=s)
            xp.divide(g, s, out=s)
            if buf is not None:
                _heavy_ball(xp, buf, s, mu)
                xp.multiply(buf, lr / k, out=s)
            else:
                xp.multiply(s, lr / k, out=s)
            xp.subtract(p, s, out=p)

        return step


@dataclass(frozen=True)
class Adagrad(Optimizer):
    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0

    @property
    def state_slots(self) -> int:
        return 1

    def state_init(self) -> tuple[float, ...]:
        return (self.initial_accumulator_value,)

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int]) -> Step:
        acc = state[0]
        lr, eps = self.lr, self.eps

        def step() -> None:
            xp.multiply(g, g, out=s)
            xp.add(acc, s, out=acc)
            xp.sqrt(acc, out=s)
            xp.add(s, eps, out=s)
            xp.divide(g, s, out=s)
            xp.multiply(s, lr, out=s)
            xp.subtract(p, s, out=p)

        return step


OPTIMIZERS: dict[str, type[Optimizer]] = {
    c.__name__: c for c in (SGD, Adam, AdamW, RMSProp, Adagrad)
}


def optimizer_from_dict(d: dict[str, Any]) -> Optimizer:
    """Rebuild a spec from :meth:`Optimizer.to_dict` (or a search-space entry)."""
    d = dict(d)
    name = d.pop("name")
    d.pop("decoupled", None)
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(OPTIMIZERS)}") \
            from None
    return cls(**d)
