"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import pytest

from engine.ops import jit


@pytest.fixture(params=["numpy", "fused"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once with the numpy kernels only and once with the fused kernels
    wherever they apply, whatever the size (:mod:`engine.ops.jit`)."""
    if request.param == "numpy":
        monkeypatch.setenv(jit.ENV, "0")
    else:
        monkeypatch.delenv(jit.ENV, raising=False)
        if jit.kernels() is None:
            pytest.skip("numba is not importable: the fused kernels cannot run")
        monkeypatch.setattr(jit, "THRESHOLDS", {k: (0, None) for k in jit.THRESHOLDS})
    return str(request.param)
