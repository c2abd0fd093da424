"""BatchNormalization's ``unbiased`` attribute (PyTorch's running variance): the
running variance takes ``var * n / (n - 1)``, at every bound batch size (the last,
smaller mini-batch runs on a prefix with its own ``n``); normalisation is unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from engine import VM, CalcGraph, Init, Mode, compile_graph


def _graph(unbiased: int) -> tuple[CalcGraph, str]:
    g = CalcGraph()
    x = g.placeholder("x", (0, 3, 2, 2))
    s, b = (g.parameter(n, (3,), init=Init.ones() if n == "s" else Init.zeros()) for n in "sb")
    m = g.parameter("m", (3,), init=Init.zeros(), trainable=False)
    v = g.parameter("v", (3,), init=Init.ones(), trainable=False)
    y = g.path("norm", Mode.FORWARD_ONLY).BatchNormalization(
        x, s, b, m, v, training_mode=1, running_update=1, momentum=0.75, unbiased=unbiased)
    return g, y.name


@pytest.mark.parametrize("unbiased", [0, 1])
@pytest.mark.parametrize("batch", [5, 2])  # 2: a smaller batch than compiled (a prefix)
def test_running_variance_is_unbiased_on_request(unbiased: int, batch: int) -> None:
    g, y = _graph(unbiased)
    vm = VM(compile_graph(g, batch_size=5, keep=[y]))
    xs = np.random.default_rng(0).normal(1.0, 2.0, size=(batch, 3, 2, 2)).astype(np.float32)
    vm.set("x", xs)
    vm.forward("norm")
    n = batch * 4
    var = xs.var(axis=(0, 2, 3), dtype=np.float64) * (n / (n - 1) if unbiased else 1.0)
    np.testing.assert_allclose(vm.get("v"), 0.75 + 0.25 * var, rtol=1e-5)
    np.testing.assert_allclose(vm.get("m"), 0.25 * xs.mean(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-6)
    mu = xs.mean(axis=(0, 2, 3), keepdims=True)
    sd = np.sqrt(xs.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(vm.get(y), (xs - mu) / sd, rtol=1e-4, atol=1e-5)
