"""The pool_activation pass: Relu moved past a max pooling gives the same values and
the same gradients, on a quarter of the elements, and is left in place wherever its
output is needed whole, a window can lie in the padding, or the activation saturates
(Sigmoid, Tanh)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, Adam, CalcGraph, Init, Mode, compile_graph
from engine.compile.passes.pipeline import DEFAULT_PASSES
from engine.models import mnist_cnn

WITHOUT = [p for p in DEFAULT_PASSES if p != "pool_activation"]
R = np.random.default_rng(3)


def ops(g: CalcGraph, passes: list[str] | None = None, path: str | None = None) -> list[str]:
    prog = compile_graph(g, batch_size=2, passes=passes)
    names = {p.name: i for i, p in enumerate(prog.paths)}
    pc = prog.paths[names[path]] if path else prog.paths[0]
    return [prog.instrs[k].op for k in pc.forward]


def pooled(act: str, **pool: object) -> CalcGraph:
    g = CalcGraph()
    x = g.placeholder("x", (0, 2, 6, 6))
    w = g.parameter("w", (3, 2, 3, 3), init=Init.he_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.op(act, p.Conv(x, w, pads=(1, 1, 1, 1)))
    y = p.MaxPool(h, **({"kernel_shape": (2, 2), "strides": (2, 2)} | pool))
    p.set_loss(p.ReduceSum(p.Mul(y, y), keepdims=0))
    return g


def test_relu_runs_after_the_pooling() -> None:
    assert ops(pooled("Relu")) == ["Conv", "MaxPool", "Relu", "Mul", "ReduceSum"]
    assert ops(pooled("Relu"), WITHOUT) == ["Conv", "Relu", "MaxPool", "Mul", "ReduceSum"]


@pytest.mark.parametrize("act", ["Sigmoid", "Tanh"])
def test_saturating_activations_stay_before_the_pooling(act: str) -> None:
    """tanh(5.0) and tanh(5.0001) are one float32: moved, the gradient would reach the
    window's larger input instead of its first."""
    assert ops(pooled(act)) == ["Conv", act, "MaxPool", "Mul", "ReduceSum"]


@pytest.mark.parametrize("pool", [{}, {"kernel_shape": (3, 3), "strides": (1, 2),
                                       "pads": (1, 1, 0, 1)},
                                  {"kernel_shape": (2, 3), "dilations": (2, 2), "ceil_mode": 1,
                                   "strides": (2, 2), "pads": (1, 0, 1, 1)}])
def test_values_and_gradients_are_the_same(pool: dict) -> None:
    x = R.normal(size=(2, 2, 6, 6)).astype(np.float32)
    x[0, 0, :2, :2] = -1.0  # a window Relu flattens to zeros
    x[1, 1, 2, 2:4] = 0.75  # a tie: the first maximum takes the gradient both ways
    results = []
    for passes in (None, WITHOUT):
        prog = compile_graph(pooled("Relu", **pool), batch_size=2, optimizer=SGD(lr=0.0),
                             passes=passes)
        assert ("Relu" in [i.op for i in prog.instrs][:2]) == (passes is not None)
        vm = VM(prog, seed=0)
        vm.set("x", x)
        vm.forward("train")
        vm.apply_loss("train")
        vm.backward("train")
        results.append((float(vm.get(vm.program.buffers[vm.program.paths[0].loss].name)),
                        vm.grad("w")))
    (loss, dw), (loss_ref, dw_ref) = results
    assert loss == pytest.approx(loss_ref, rel=1e-6)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pool", [
    {"kernel_shape": (1, 2), "strides": (1, 2), "pads": (0, 2, 0, 0)},  # a window in the pads
    {"kernel_shape": (1, 2), "dilations": (1, 2), "pads": (0, 1, 0, 1)},  # one skipping the row
])
def test_left_alone_where_a_window_can_miss_the_input(pool: dict) -> None:
    """There MaxPool gives -inf, and Relu of it 0: not the same values."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 1, 1, 1 if "dilations" in pool else 4))
    p = g.path("f")
    p.MaxPool(p.Relu(x), outputs=["m"], **pool)
    g.output("m")
    assert ops(g) == ["Relu", "MaxPool"]


def test_the_training_plan_is_smaller() -> None:
    with_pass = compile_graph(mnist_cnn(), batch_size=64, optimizer=Adam(lr=1e-3))
    without = compile_graph(mnist_cnn(), batch_size=64, optimizer=Adam(lr=1e-3),
                            passes=WITHOUT)
    assert with_pass.total_bytes < without.total_bytes
    vm = VM(with_pass)
    assert vm.allocated_bytes == with_pass.total_bytes


def test_left_alone_where_the_activation_is_needed_whole() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 2, 4, 4))
    p = g.path("f")
    h = p.Relu(x, outputs=["h"])
    p.MaxPool(h, kernel_shape=(2, 2), strides=(2, 2))
    p.ReduceSum(h)  # a second reader
    assert ops(g) == ["Relu", "MaxPool", "ReduceSum"]

    kept = CalcGraph()
    x = kept.placeholder("x", (0, 2, 4, 4))
    p = kept.path("f")
    p.MaxPool(p.Relu(x, outputs=["h"]), kernel_shape=(2, 2), strides=(2, 2), outputs=["m"])
    kept.output("h", "m")  # h read back by the user
    assert ops(kept) == ["Relu", "MaxPool"]

    indices = CalcGraph()
    x = indices.placeholder("x", (0, 2, 4, 4))
    p = indices.path("f")
    p.MaxPool(p.Relu(x), kernel_shape=(2, 2), strides=(2, 2), outputs=["m", "i"])
    indices.output("m", "i")
    assert ops(indices) == ["Relu", "MaxPool"]

    leaky = CalcGraph()  # not among the activations it moves
    x = leaky.placeholder("x", (0, 2, 4, 4))
    p = leaky.path("f")
    p.MaxPool(p.LeakyRelu(x), kernel_shape=(2, 2), strides=(2, 2), outputs=["m"])
    leaky.output("m")
    assert ops(leaky) == ["LeakyRelu", "MaxPool"]
