"""A small convolutional network (Conv, Relu, MaxPool, Gemm): exact memory, no
allocation that grows with the batch in a training step, and it learns."""

from __future__ import annotations

import numpy as np

from engine import VM, Adam, CalcGraph, Init, Mode, compile_graph
from tests.allocations import step_allocations


def tiny_cnn(channels: int = 4) -> CalcGraph:
    g = CalcGraph(name="tiny_cnn")
    x = g.placeholder("x", (0, 1, 8, 8))
    y = g.placeholder("y", (0,), dtype="int64")
    w1 = g.parameter("w1", (channels, 1, 3, 3), init=Init.he_uniform())
    b1 = g.parameter("b1", (channels,), init=Init.zeros())
    w2 = g.parameter("w2", (channels * 16, 10), init=Init.xavier_uniform())
    b2 = g.parameter("b2", (10,), init=Init.zeros())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Relu(p.Conv(x, w1, b1, pads=(1, 1, 1, 1)))
    h = p.MaxPool(h, kernel_shape=(2, 2), strides=(2, 2))
    logits = p.Gemm(p.Flatten(h), w2, b2, outputs=["logits"])
    loss, _ = p.SoftmaxCrossEntropyLoss(logits, y, outputs=["loss", "log_prob"])
    p.set_loss(loss)
    return g


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images[:, None] / 16.0).astype(np.float32), d.target.astype(np.int64)


def _step_memory(batch: int) -> tuple[int, int]:
    """(bytes retained, peak transient bytes) over 20 training steps at ``batch``."""
    x, y = digits()
    prog = compile_graph(tiny_cnn(), batch_size=batch, optimizer=Adam(lr=0.01))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    assert prog.zone_bytes["workspace"] > 0  # the im2col columns are planned

    def step() -> None:
        vm.set("x", x[:batch])
        vm.set("y", y[:batch])
        vm.train_step("train")

    for _ in range(5):  # untraced: the first steps bind the kernels
        step()
    return step_allocations(step, warmup=0, runs=20)


def test_a_cnn_step_is_exact_and_allocates_nothing_that_grows() -> None:
    # What remains is numpy's iteration buffer for a broadcasting add (the biases): at
    # most 8,192 elements an operand, whatever the batch.
    small, large = _step_memory(512), _step_memory(1536)
    assert small[0] < 4096 and large[0] < 4096
    assert large[1] <= 3 * 8192 * 4 + 4096
    assert large[1] <= small[1] + 4096  # three times the batch, no more transient


def test_a_cnn_learns_the_digits() -> None:
    from engine.runtime.train import train_epoch

    x, y = digits()
    vm = VM(compile_graph(tiny_cnn(8), batch_size=64, optimizer=Adam(lr=0.01)), seed=0)
    rng = np.random.default_rng(0)
    losses = [train_epoch(vm, x[:1500], y[:1500], rng) for _ in range(8)]
    assert losses[-1] < 0.25 < losses[0]
    vm.set("x", x[1500:1564])
    vm.set("y", y[1500:1564])
    vm.forward("train")
    acc = float(np.mean(vm.get("log_prob").argmax(1) == y[1500:1564]))
    assert acc > 0.85
