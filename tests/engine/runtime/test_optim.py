"""Each optimizer against an independent reference of PyTorch's update formulas, and
L1/L2 regularization, on a linear model with known gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine import (
    SGD,
    VM,
    Adagrad,
    Adam,
    AdamW,
    CalcGraph,
    Init,
    Mode,
    Optimizer,
    Regularization,
    RMSProp,
    compile_graph,
)

RNG = np.random.default_rng(3)
X = RNG.normal(size=(8, 5))
T = RNG.normal(size=(8, 2))
W0 = RNG.normal(size=(5, 2))


def build(opt: Optimizer, reg: Regularization | None = None) -> VM:
    g = CalcGraph()
    x = g.placeholder("x", (0, 5), dtype="float64")
    t = g.placeholder("t", (0, 2), dtype="float64")
    w = g.parameter("w", (5, 2), init=Init.from_values(W0.ravel().tolist()),
                    regularization=reg, dtype="float64")
    p = g.path("fit", Mode.BACKWARD_ENABLED)
    p.set_loss(p.MSELoss(p.MatMul(x, w), t))
    vm = VM(compile_graph(g, batch_size=8, optimizer=opt))
    vm.set("x", X)
    vm.set("t", T)
    return vm


def grad(w: np.ndarray) -> np.ndarray:
    return 2.0 * X.T @ (X @ w - T) / T.size


def reference(opt: Optimizer, steps: int, reg: Regularization | None = None) -> np.ndarray:
    w = W0.copy()
    s1 = np.full_like(w, opt.state_init()[0] if opt.state_slots else 0.0)
    s2 = np.zeros_like(w)
    for n in range(1, steps + 1):
        g = grad(w)
        if reg is not None:
            g = g + (reg.coef * w if reg.kind == "l2" else reg.coef * np.sign(w))
        if isinstance(opt, SGD):
            if opt.weight_decay:
                g = g + opt.weight_decay * w
            if opt.momentum:
                s1 = opt.momentum * s1 + g
                g = g + opt.momentum * s1 if opt.nesterov else s1
            w = w - opt.lr * g
        elif isinstance(opt, Adam):
            if isinstance(opt, AdamW):
                w = w * (1 - opt.lr * opt.weight_decay)
            elif opt.weight_decay:
                g = g + opt.weight_decay * w
            s1 = opt.beta1 * s1 + (1 - opt.beta1) * g
            s2 = opt.beta2 * s2 + (1 - opt.beta2) * g * g
            bc1, bc2 = 1 - opt.beta1**n, 1 - opt.beta2**n
            w = w - opt.lr / bc1 * s1 / (np.sqrt(s2) / math.sqrt(bc2) + opt.eps)
        elif isinstance(opt, RMSProp):
            s1 = opt.alpha * s1 + (1 - opt.alpha) * g * g
            d = g / (np.sqrt(s1) + opt.eps)
            if opt.momentum:
                s2 = opt.momentum * s2 + d
                d = s2
            w = w - opt.lr * d
        elif isinstance(opt, Adagrad):
            s1 = s1 + g * g
            w = w - opt.lr * g / (np.sqrt(s1) + opt.eps)
    return w


OPTS = [
    SGD(lr=0.1), SGD(lr=0.1, momentum=0.9), SGD(lr=0.05, momentum=0.9, nesterov=True),
    SGD(lr=0.1, weight_decay=0.01), Adam(lr=0.01), Adam(lr=0.01, weight_decay=0.1),
    AdamW(lr=0.01, weight_decay=0.1), RMSProp(lr=0.01), RMSProp(lr=0.01, momentum=0.5),
    Adagrad(lr=0.1), Adagrad(lr=0.1, initial_accumulator_value=0.1),
]


@pytest.mark.parametrize("opt", OPTS, ids=repr)
def test_optimizer_matches_reference(opt: Optimizer, kernel_path: str) -> None:
    vm = build(opt)
    for _ in range(10):
        vm.train_step("fit")
    np.testing.assert_allclose(vm.get("w"), reference(opt, 10), rtol=1e-10, atol=1e-12)
    assert vm.program.zone_bytes["optimizer"] == opt.state_slots * vm.program.param_region


@pytest.mark.parametrize("reg", [Regularization.l1(0.05), Regularization.l2(0.1)], ids=repr)
def test_regularization_is_added_to_the_gradient(reg: Regularization,
                                                kernel_path: str) -> None:
    vm = build(SGD(lr=0.1), reg)
    for _ in range(5):
        vm.train_step("fit")
    np.testing.assert_allclose(vm.get("w"), reference(SGD(lr=0.1), 5, reg), rtol=1e-10)
