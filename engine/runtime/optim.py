"""Optimizers: pure-data specs (part of a compiled :class:`~engine.runtime.program.Program`,
since their state is sized into the optimizer zone) and the kernels that apply them.

The update follows PyTorch's formulas (Adam's and RMSProp's running averages are
stored scaled by a constant, which saves passes; the parameters come out the same to
rounding).  Trainable parameters are laid out
contiguously in the forward zone, their gradients identically in the gradient zone,
and each state slot identically in the optimizer zone, so one update touches every
parameter with a handful of vectorised calls over one flat region.  Where numba is
available (:mod:`engine.ops.jit`) and the region is large enough, the whole update is
one compiled pass over it instead (the same formulas in the same order, so the same
values to float32 rounding); ``fused=False`` on :meth:`Optimizer.bind` keeps numpy.

>>> from engine.runtime.optim import Adam, optimizer_from_dict
>>> Adam(lr=0.01).state_slots
2
>>> optimizer_from_dict({"name": "SGD", "lr": 0.1, "momentum": 0.9}).state_slots
1
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.ops import jit
from engine.ops._base import Step, is_numpy


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

    def slot_values(self, region: Any) -> tuple[Any, ...]:
        """What each state slot starts from: a float, or an array of the parameter
        region's length.  ``region`` lists the region's parameters as
        ``(offset in elements, element count)``, in order (a stack's parameters whose
        models alternate add the elements of each model's run, see
        :meth:`PerModelLR.rate_runs`)."""
        return self.state_init()

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
             lr: Any = None, fused: bool | None = None, momentum: Any = None) -> Step:
        """A step updating ``p`` from ``g``; ``state`` are its slots, ``s`` a scratch of the
        same shape, ``t`` a one-element step counter shared by the program.  ``lr``, an
        array like ``p``, replaces the scalar learning rate (a stack of models, each
        with its own); so does ``momentum`` SGD's momentum (:attr:`PerModelLR.momenta`).
        ``fused``: one compiled pass (True), numpy calls (False), or chosen by the
        region's size (None, :func:`engine.ops.jit.use_fused`)."""
        extra: dict[str, Any] = {}
        if momentum is not None:
            if not isinstance(self, SGD) or not self.momentum:
                raise ValueError(f"{self} takes no momentum per element: only SGD with "
                                 "momentum does")
            extra["momentum"] = momentum
        kernels = _fused_kernels(xp, p, g, state, lr, fused, momentum)
        if kernels is not None:
            if momentum is not None:
                extra["momentum"] = momentum.reshape(-1)
            return self._bind_fused(kernels, p.reshape(-1), g.reshape(-1),
                                    [a.reshape(-1) for a in state], t, lr, **extra)
        if fused is not False and not is_numpy(xp) and p.dtype.kind == "f":
            step = self._bind_device(xp, p, g, state, t, lr, **extra)
            if step is not None:
                return step
        return self._bind_numpy(xp, p, g, state, s, t, lr, **extra)

    def _bind_device(self, xp: Any, p: Any, g: Any, state: list[Any], t: list[int],
                     lr: Any) -> Step | None:
        """The update as one GPU kernel (None: the array calls, one kernel each)."""
        return None

    def _bind_numpy(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
                    lr: Any) -> Step:
        raise NotImplementedError

    def _bind_fused(self, k: Any, p: Any, g: Any, state: list[Any], t: list[int],
                    lr: Any) -> Step:
        raise NotImplementedError


def _fused_kernels(xp: Any, p: Any, g: Any, state: list[Any], lr: Any,
                   fused: bool | None, momentum: Any = None) -> Any:
    """The fused kernels' module when the update should run as one pass: numpy arrays
    (never on the GPU), all C-contiguous and of one float type."""
    if fused is False or not is_numpy(xp) or p.dtype.kind != "f":
        return None
    arrays = [p, g, *state, *([] if lr is None or isinstance(lr, int | float) else [lr]),
              *([] if momentum is None else [momentum])]
    if any(not a.flags.c_contiguous or a.dtype != p.dtype for a in arrays):
        return None
    if fused is None:
        return jit.kernels() if jit.use_fused("optimizer", p.size) else None
    return jit.kernels()


# The updates as one CUDA kernel each (CuPy's ElementwiseKernel), the same formulas as the
# array calls: on a GPU each array call is a kernel launch, and an update of many small
# launches costs more than its arithmetic.  ``rate`` is the learning rate, a scalar or an
# array like ``p`` (a stack's per-model rates).  One difference: the kernels leave the
# gradient as backward wrote it, where the array calls fold an L2 weight decay into it
# (``vm.grad`` after ``optimize`` then differs; the parameters do not).  RMSProp and
# Adagrad keep the array calls.
_DEVICE_UPDATES = {
    "sgd": ("T g, T rate, T wd", "T p",
            "T gg = wd != (T)0 ? g + wd * p : g; p = p - rate * gg;"),
    "sgd_momentum": ("T g, T rate, T mu, T wd, int32 nesterov", "T p, T buf",
                     "T gg = wd != (T)0 ? g + wd * p : g; T bb = mu * buf + gg; buf = bb;"
                     "p = nesterov ? p - rate * gg - (mu * rate) * bb : p - rate * bb;"),
    # mode 1: decoupled weight decay (AdamW), 2: L2 added to the gradient
    "adam": ("T g, T rate, T b1, T b2, T epsk, T coef, T wd, int32 mode", "T p, T m, T v",
             "T gg = g; T pp = p;"
             "if (mode == 1) pp = pp - rate * wd * pp; else if (mode == 2) gg = gg + wd * pp;"
             "T mm = b1 * m + gg; T vv = b2 * v + gg * gg; m = mm; v = vv;"
             "p = pp - (mm / (sqrt(vv) + epsk)) * (coef * rate);"),
}


def _device_kernel(xp: Any, name: str) -> Any:
    params, outs, body = _DEVICE_UPDATES[name]
    return xp.ElementwiseKernel(params, outs, body, f"calcgraph_{name}_update")


def _rates(p: Any, lr: Any) -> tuple[Any, bool]:
    """(the rates as an array the kernels read, whether it is one scalar rate)."""
    if isinstance(lr, int | float):
        return np.full(1, lr, dtype=p.dtype), True
    return lr.reshape(-1), False


def _consts(p: Any, n: int) -> Any:
    """The kernel's scalars, in the parameters' type (numpy rounds Python floats to it
    the same way), written in place when they change per step."""
    return np.zeros(n, dtype=p.dtype)


def _times_lr(xp: Any, src: Any, coef: Any, lr: Any, out: Any) -> None:
    """out = coef * lr * src, with ``lr`` and ``coef`` each a float or an elementwise
    array (a stack's rates, SGD's momenta)."""
    scalar = isinstance(coef, int | float)
    if isinstance(lr, int | float) and scalar:
        xp.multiply(src, coef * lr, out=out)
        return
    xp.multiply(src, lr, out=out)
    if not scalar or coef != 1.0:
        xp.multiply(out, coef, out=out)


def _add_scaled(xp: Any, dst: Any, src: Any, coef: float, s: Any) -> None:
    """dst += coef * src, through the scratch ``s``."""
    xp.multiply(src, coef, out=s)
    xp.add(dst, s, out=dst)


def _heavy_ball(xp: Any, buf: Any, direction: Any, mu: Any) -> None:
    """buf = mu * buf + direction: the momentum shared by SGD and RMSProp (``mu`` a
    float, or an array like ``buf``)."""
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

    # ``momentum``: an array like ``p`` in place of :attr:`momentum` (a stack's
    # per-model momenta, :class:`PerModelLR`; :attr:`momentum` is then any non-zero).
    def _bind_fused(self, k: Any, p: Any, g: Any, state: list[Any], t: list[int],
                    lr: Any, momentum: Any = None) -> Step:
        lr = self.lr if lr is None else lr
        rates, one = _rates(p, lr)
        mu = self.momentum
        mus, one_mu = _rates(p, mu) if momentum is None else (momentum, False)
        c = _consts(p, 4)
        c[:] = (lr if one else 0.0, mu, self.weight_decay,
                mu * lr if one and one_mu else 0.0)
        buf = state[0] if mu else p
        has_momentum, nesterov, run = bool(mu), self.nesterov, k.sgd
        return lambda: run(p, g, buf, rates, one, c, has_momentum, nesterov, mus, one_mu)

    def _bind_device(self, xp: Any, p: Any, g: Any, state: list[Any], t: list[int],
                     lr: Any, momentum: Any = None) -> Step | None:
        rate = self.lr if lr is None else lr
        mu, wd = self.momentum if momentum is None else momentum, self.weight_decay
        if not self.momentum:
            plain = _device_kernel(xp, "sgd")
            return lambda: plain(g, rate, wd, p)
        kernel, buf, nesterov = _device_kernel(xp, "sgd_momentum"), state[0], \
            int(self.nesterov)
        return lambda: kernel(g, rate, mu, wd, nesterov, p, buf)

    def _bind_numpy(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
                    lr: Any, momentum: Any = None) -> Step:
        mu = self.momentum if momentum is None else momentum
        wd, nesterov = self.weight_decay, self.nesterov
        lr = self.lr if lr is None else lr
        buf = state[0] if self.momentum else None

        def step() -> None:
            # The gradient has been consumed once the update is done, so weight decay
            # folds into it in place: g += wd * p.
            if wd:
                _add_scaled(xp, g, p, wd, s)
            if buf is None:
                _times_lr(xp, g, 1.0, lr, s)
            else:
                _heavy_ball(xp, buf, g, mu)
                if nesterov:  # p -= lr * (g + mu * buf)
                    _times_lr(xp, g, 1.0, lr, s)
                    xp.subtract(p, s, out=p)
                    _times_lr(xp, buf, mu, lr, s)
                else:
                    _times_lr(xp, buf, 1.0, lr, s)
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

    def _bind_fused(self, k: Any, p: Any, g: Any, state: list[Any], t: list[int],
                    lr: Any) -> Step:
        m, v = state
        b1, b2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        lr = self.lr if lr is None else lr
        rates, one = _rates(p, lr)
        c = _consts(p, 6)
        c[:2] = (b1, b2)
        c[4] = wd
        if one:
            c[5] = 1.0 - lr * wd
        decoupled, run = self.decoupled, k.adam

        def step() -> None:
            n = t[0]
            kk = math.sqrt((1.0 - b2) / (1.0 - b2**n))
            coef = (1.0 - b1) / ((1.0 - b1**n) * kk)
            c[2] = eps / kk
            c[3] = coef * lr if one else coef
            run(p, g, m, v, rates, one, c, decoupled)

        return step

    def _bind_device(self, xp: Any, p: Any, g: Any, state: list[Any], t: list[int],
                     lr: Any) -> Step | None:
        m, v = state
        b1, b2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        rate = self.lr if lr is None else lr
        mode = (1 if self.decoupled else 2) if wd else 0
        run = _device_kernel(xp, "adam")

        def step() -> None:  # the bias corrections as in the array calls
            n = t[0]
            kk = math.sqrt((1.0 - b2) / (1.0 - b2**n))
            run(g, rate, b1, b2, eps / kk, (1.0 - b1) / ((1.0 - b1**n) * kk), wd, mode,
                p, m, v)

        return step

    def _bind_numpy(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
                    lr: Any) -> Step:
        # The slots hold PyTorch's m and v divided by (1 - beta1) and (1 - beta2):
        # m' = beta1 m' + g and v' = beta2 v' + g^2 take one pass fewer each, and the
        # constants fold into the update (10 passes over the region instead of 13).
        m, v = state
        b1, b2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        lr = self.lr if lr is None else lr
        decoupled = self.decoupled

        def step() -> None:
            n = t[0]
            if wd and decoupled and isinstance(lr, int | float):
                xp.multiply(p, 1.0 - lr * wd, out=p)
            elif wd and decoupled:  # p -= lr * wd * p
                _times_lr(xp, p, wd, lr, s)
                xp.subtract(p, s, out=p)
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
            _times_lr(xp, s, (1.0 - b1) / ((1.0 - b1**n) * k), lr, s)
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

    def _bind_fused(self, k: Any, p: Any, g: Any, state: list[Any], t: list[int],
                    lr: Any) -> Step:
        lr = self.lr if lr is None else lr
        rates, one = _rates(p, lr)
        kk = math.sqrt(1.0 - self.alpha)
        c = _consts(p, 4)
        c[:] = (self.alpha, self.eps / kk, self.momentum, 1.0 / kk * lr if one else 1.0 / kk)
        sq, buf = state[0], state[1] if self.momentum else state[0]
        momentum, run = bool(self.momentum), k.rmsprop
        return lambda: run(p, g, sq, buf, rates, one, c, momentum)

    def _bind_numpy(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
                    lr: Any) -> Step:
        # The square average is kept divided by (1 - alpha): one pass fewer (see Adam).
        sq = state[0]
        buf = state[1] if self.momentum else None
        alpha, eps, mu = self.alpha, self.eps, self.momentum
        lr = self.lr if lr is None else lr
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
                _times_lr(xp, buf, 1.0 / k, lr, s)
            else:
                _times_lr(xp, s, 1.0 / k, lr, s)
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

    def _bind_fused(self, k: Any, p: Any, g: Any, state: list[Any], t: list[int],
                    lr: Any) -> Step:
        lr = self.lr if lr is None else lr
        rates, one = _rates(p, lr)
        c = _consts(p, 2)
        c[:] = (self.eps, 1.0 * lr if one else 0.0)
        acc, run = state[0], k.adagrad
        return lambda: run(p, g, acc, rates, one, c)

    def _bind_numpy(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
                    lr: Any) -> Step:
        acc = state[0]
        eps = self.eps
        lr = self.lr if lr is None else lr

        def step() -> None:
            xp.multiply(g, g, out=s)
            xp.add(acc, s, out=acc)
            xp.sqrt(acc, out=s)
            xp.add(s, eps, out=s)
            xp.divide(g, s, out=s)
            _times_lr(xp, s, 1.0, lr, s)
            xp.subtract(p, s, out=p)

        return step


@dataclass(frozen=True)
class PerModelLR(Optimizer):
    """``base``'s update for a stack of models (:mod:`engine.compile.stack`), each with its
    own learning rate ``lrs[k]`` and, where ``base`` is SGD with momentum and the models'
    differ, its own momentum ``momenta[k]``.  Each lives in one more optimizer slot, an
    array as long as the parameter region, so the update stays one pass per term over
    the whole region (a stacked parameter ``[K, ...]`` holds model k's values in slice
    k).

    >>> opt = PerModelLR(base=Adam(), lrs=(1e-3, 1e-2))
    >>> opt.state_slots, opt.lrs
    (3, (0.001, 0.01))
    >>> PerModelLR(base=SGD(momentum=0.9), lrs=(0.1, 0.2), momenta=(0.9, 0.5)).state_slots
    3
    """

    base: Optimizer = field(default_factory=lambda: SGD())
    lrs: tuple[float, ...] = ()
    momenta: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.momenta and (not isinstance(self.base, SGD) or not self.base.momentum or
                             len(self.momenta) != len(self.lrs) or
                             not all(self.momenta)):
            raise ValueError(f"momenta {self.momenta} need an SGD base with momentum and "
                             f"a non-zero momentum for each of the {len(self.lrs)} models")

    @property
    def name(self) -> str:
        return "PerModelLR"

    @property
    def per_model_slots(self) -> int:
        """The slots, last, that hold the models' hyperparameters (the program's, not
        the models' learned state)."""
        return 1 + bool(self.momenta)

    @property
    def state_slots(self) -> int:
        return self.base.state_slots + self.per_model_slots

    def state_init(self) -> tuple[float, ...]:
        return (*self.base.state_init(), *(0.0,) * self.per_model_slots)

    def slot_values(self, region: Any) -> tuple[Any, ...]:
        import numpy as np

        size = max((e[0] + e[1] for e in region), default=0)
        arrays = []
        for runs in self.per_model_runs(region):
            values = np.zeros(size, dtype=np.float64)
            for first, count, v in runs:
                values[first : first + count] = v
            arrays.append(values)
        return (*self.base.slot_values(region), *arrays)

    def per_model_runs(self, region: Any) -> list[list[tuple[int, int, float]]]:
        """The per-model slots as runs (:meth:`rate_runs`), one list per slot."""
        return [self.rate_runs(region)] + \
            ([self.rate_runs(region, self.momenta)] if self.momenta else [])

    def rate_runs(self, region: Any, values: tuple[float, ...] | None = None
                  ) -> list[tuple[int, int, float]]:
        """The rates slot as runs ``(first element, count, rate)``, model k's slice of
        each parameter taking ``lrs[k]`` (or ``values[k]``): what :meth:`slot_values`
        spreads into an array of the whole region, for a writer that fills the slot in
        place.  A region entry ``(offset, count, inner)`` is a parameter whose models
        alternate every ``inner`` elements (``[in, K, out]``: ``inner = out``);
        ``(offset, count)``, one whose models are its first axis.

        >>> PerModelLR(base=SGD(), lrs=(0.1, 0.2)).rate_runs([(0, 8, 2)])
        [(0, 2, 0.1), (2, 2, 0.2), (4, 2, 0.1), (6, 2, 0.2)]
        """
        values = self.lrs if values is None else values
        k = len(values)
        runs: list[tuple[int, int, float]] = []
        for offset, count, *rest in region:
            inner = rest[0] if rest else count // k
            if count % k or not inner or count % (k * inner):
                raise ValueError(f"a parameter of {count} elements is not a stack of {k}"
                                 + (f" in runs of {inner}" if rest else ""))
            for first in range(offset, offset + count, k * inner):
                runs.extend((first + j * inner, inner, float(v))
                            for j, v in enumerate(values))
        return runs

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base.to_dict(), "lrs": list(self.lrs),
                **({"momenta": list(self.momenta)} if self.momenta else {})}

    def bind(self, xp: Any, p: Any, g: Any, state: list[Any], s: Any, t: list[int],
             lr: Any = None, fused: bool | None = None, momentum: Any = None) -> Step:
        n = self.base.state_slots
        return self.base.bind(xp, p, g, state[:n], s, t, lr=state[n], fused=fused,
                              momentum=state[n + 1] if self.momenta else None)


# The optimizers a user names (search spaces, dicts); PerModelLR is made by engine.compile.stack.
OPTIMIZERS: dict[str, type[Optimizer]] = {
    c.__name__: c for c in (SGD, Adam, AdamW, RMSProp, Adagrad)
}


def optimizer_from_dict(d: dict[str, Any]) -> Optimizer:
    """Rebuild a spec from :meth:`Optimizer.to_dict` (or a search-space entry)."""
    d = dict(d)
    name = d.pop("name")
    d.pop("decoupled", None)
    if name == "PerModelLR":
        return PerModelLR(base=optimizer_from_dict(d["base"]), lrs=tuple(d["lrs"]),
                          momenta=tuple(d.get("momenta", ())))
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(OPTIMIZERS)}") \
            from None
    return cls(**d)
