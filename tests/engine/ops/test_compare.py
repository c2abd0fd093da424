"""Comparisons and Not (engine.ops.compare): numpy's values for every pair of element
types the engine has, broadcasting both ways, a clear error for mixed types and a Not
of numbers, and no gradient through them (a parameter before one trains through the
other operand of the product it masks)."""

from __future__ import annotations

import operator

import numpy as np
import pytest

from engine import SGD, VM, CalcGraph, Mode, compile_graph
from engine.errors import EngineError
from engine.runtime.backends import gpu_available

OPS = {"Equal": operator.eq, "Less": operator.lt, "LessOrEqual": operator.le,
       "Greater": operator.gt, "GreaterOrEqual": operator.ge}


def run(op: str, a: np.ndarray, b: np.ndarray, device: str = "cpu") -> np.ndarray:
    g = CalcGraph()
    x = g.placeholder("a", (0, *a.shape[1:]), dtype=a.dtype.name)
    y = g.constant(b.ravel().tolist(), shape=b.shape, name="b", dtype=b.dtype.name)
    out = getattr(g.path("infer", Mode.FORWARD_ONLY), op)(x, y)
    vm = VM(compile_graph(g, batch_size=len(a), keep=[out.name], device=device))
    vm.set("a", a)
    vm.forward("infer")
    return vm.get(out.name)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "uint8"])
def test_each_comparison_is_numpys_with_broadcasting(op: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, size=(5, 3, 4)).astype(dtype)
    for b in (rng.integers(0, 4, size=(3, 1)).astype(dtype),  # broadcast into a
              rng.integers(0, 4, size=(1, 3, 4)).astype(dtype)):
        got = run(op, a, b)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, OPS[op](a, b))


def test_not_of_a_comparison() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 3))
    c = g.constant([0.5], shape=(), name="c")
    p = g.path("infer", Mode.FORWARD_ONLY)
    out = p.Not(p.LessOrEqual(x, c))
    vm = VM(compile_graph(g, batch_size=4, keep=[out.name]))
    a = np.random.default_rng(1).random((4, 3)).astype(np.float32)
    vm.set("x", a)
    vm.forward("infer")
    np.testing.assert_array_equal(vm.get(out.name), a > 0.5)


@pytest.mark.parametrize("build,words", [
    (lambda p, x, i: p.Equal(x, i), "compared values"),
    (lambda p, x, i: p.Not(x), "Not takes a bool tensor, got float32"),
])
def test_mixed_types_and_not_of_numbers_are_refused(build: object, words: str) -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 3))
    i = g.placeholder("i", (0, 3), dtype="int64")
    p = g.path("infer", Mode.FORWARD_ONLY)
    out = build(p, x, i)  # type: ignore[operator]
    with pytest.raises(EngineError, match=words):
        compile_graph(g, batch_size=2, keep=[out.name])


def test_a_mask_of_a_parameter_sends_it_no_gradient_through_the_comparison() -> None:
    """loss = sum(w * (w > 0)): dloss/dw is the mask itself (the comparison's share is
    zero), as PyTorch computes it."""
    g = CalcGraph()
    w = g.parameter("w", (4,), init=None)
    zero = g.constant([0.0], shape=(), name="zero")
    p = g.path("train", Mode.BACKWARD_ENABLED)
    mask = p.Cast(p.Greater(w, zero), to="float32")
    p.set_loss(p.ReduceSum(p.Mul(w, mask), keepdims=0))
    vm = VM(compile_graph(g, batch_size=1, optimizer=SGD(lr=1.0)))
    vm.assign("w", np.array([-1.0, 2.0, 0.0, 3.0], np.float32))
    vm.forward("train")
    vm.apply_loss("train")
    vm.backward("train")
    np.testing.assert_array_equal(vm.grad("w"), [0.0, 1.0, 0.0, 1.0])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a CUDA device")
@pytest.mark.parametrize("op", sorted(OPS))
def test_each_comparison_gives_the_same_mask_on_the_gpu(op: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, size=(6, 3, 4)).astype(np.float32)
    b = rng.integers(0, 4, size=(3, 1)).astype(np.float32)
    np.testing.assert_array_equal(run(op, a, b, "gpu"), run(op, a, b))
