"""The compiled float32 tanh and sigmoid (a rational function, engine.ops._jit_kernels.
tanh1) against the exact functions over a dense sweep of float32: the error bound the
kernels' docstring states, and the values at the edges (zero, tiny, saturated,
infinite, NaN) as numpy gives them."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import jit


@pytest.fixture
def ks(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.delenv(jit.ENV, raising=False)
    kernels = jit.kernels()
    if kernels is None:
        pytest.skip("numba is not importable")
    return kernels


def sweep() -> np.ndarray:
    """Every 1e-5 over [-20, 20], small values around zero, and the edges."""
    rng = np.random.default_rng(3)
    return np.concatenate([
        np.linspace(-20, 20, 4_000_001, dtype=np.float32),
        (rng.normal(size=200_000) * 1e-3).astype(np.float32),
        np.float32(2.0) ** -np.arange(1, 149, dtype=np.float32),
        np.array([0.0, -0.0, 4e-4, -4e-4, 9.0, -9.0, 3.4e38, -3.4e38], np.float32),
    ])


def test_tanh_is_within_its_stated_bound(ks) -> None:
    x = sweep()
    y = np.empty_like(x)
    ks.tanh(x, y)
    exact = np.tanh(x.astype(np.float64))
    err = np.abs(y - exact)
    assert err.max() <= 3.5e-7
    ulps = err / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 6.5 and ulps.mean() <= 0.75
    assert np.abs(y).max() <= 1.0  # never past saturation, unlike the bare quotient


def test_tanh_keeps_the_edges(ks) -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 9.5, -30.0, 3.4e38], np.float32)
    y = np.empty_like(x)
    ks.tanh(x, y)
    # float32's tanh is exactly +-1 past 9.01 (numpy's own is 1 ulp short at 9.5)
    np.testing.assert_array_equal(y, [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0, 1.0])
    assert np.signbit(y[1])  # tanh(-0) is -0
    tiny = np.array([1e-40, -3e-4, 2.0 ** -20], np.float32)  # tanh(x) = x to rounding
    ks.tanh(tiny, out := np.empty_like(tiny))
    np.testing.assert_array_equal(out, tiny)


def test_sigmoid_is_within_its_stated_bound(ks) -> None:
    x = np.concatenate([np.linspace(-40, 40, 2_000_001, dtype=np.float32),
                        np.array([np.inf, -np.inf, np.nan], np.float32)])
    y = np.empty_like(x)
    ks.sigmoid(x, y)
    exact = 1.0 / (1.0 + np.exp(-x[:-3].astype(np.float64)))
    assert np.abs(y[:-3] - exact).max() <= 2e-7
    assert np.nanmin(y) >= 0.0 and np.nanmax(y) <= 1.0
    assert y[-3] == 1.0 and y[-2] == 0.0 and np.isnan(y[-1])


def test_the_bias_forms_are_the_flat_ones_after_the_add(ks) -> None:
    rng = np.random.default_rng(4)
    z = (rng.normal(size=(33, 17)) * 6).astype(np.float32)
    b = rng.normal(size=17).astype(np.float32)
    for fused, flat in ((ks.bias_sigmoid, ks.sigmoid), (ks.bias_tanh, ks.tanh)):
        y = z.copy()
        fused(y, b)
        want = np.empty_like(z)
        flat((z + b).reshape(-1), want.reshape(-1))
        np.testing.assert_array_equal(y, want)
