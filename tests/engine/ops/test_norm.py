"""BatchNormalization's running statistics as model state, and exact memory for both
normalisations (their values and gradients are checked in test_gradients and by
ONNX's node tests)."""

from __future__ import annotations

import numpy as np

from engine import SGD, VM, CalcGraph, Init, Mode, compile_graph
from engine.runtime.train import evaluate, train_epoch
from tests.allocations import step_allocations

R = np.random.default_rng(3)
X = R.normal(2.0, 3.0, size=(96, 3, 4, 4)).astype(np.float32)
Y = (X.mean(axis=(2, 3)).argmax(axis=1)).astype(np.int64)


def bn_net(momentum: float = 0.8) -> CalcGraph:
    """Conv -> BatchNorm -> Relu -> GlobalAveragePool -> Flatten -> Gemm, with the
    running statistics as non-trainable parameters."""
    g = CalcGraph(name="bn")
    x = g.placeholder("x", (0, 3, 4, 4))
    y = g.placeholder("y", (0,), dtype="int64")
    w = g.parameter("w", (4, 3, 3, 3), init=Init.he_uniform())
    s = g.parameter("s", (4,), init=Init.ones())
    b = g.parameter("b", (4,), init=Init.zeros())
    m = g.parameter("m", (4,), init=Init.zeros(), trainable=False)
    v = g.parameter("v", (4,), init=Init.ones(), trainable=False)
    fc = g.parameter("fc", (4, 3), init=Init.xavier_uniform())
    train = g.path("train", Mode.BACKWARD_ENABLED)
    ev = g.path("eval", Mode.FORWARD_ONLY)
    for p, training in ((train, 1), (ev, 0)):
        h = p.Conv(x, w, pads=(1, 1, 1, 1))
        h = p.BatchNormalization(h, s, b, m, v, training_mode=training,
                                 running_update=training, momentum=momentum)
        h = p.Gemm(p.Flatten(p.GlobalAveragePool(p.Relu(h))), fc)
        if training:
            loss, _ = p.SoftmaxCrossEntropyLoss(h, y, outputs=["loss", "log_prob"])
            p.set_loss(loss)
        else:
            p.Accuracy(h, y, outputs=["accuracy"])
    g.output("loss", "accuracy", "m", "v")
    return g


def conv_out(vm: VM, x: np.ndarray) -> np.ndarray:
    """The convolution's output for ``x`` (numpy, from the VM's current weights)."""
    w = vm.get("w")
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((len(x), 4, 4, 4))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 4, j:j + 4], w[:, :, i, j])
    return out


def test_running_statistics_follow_the_batches() -> None:
    vm = VM(compile_graph(bn_net(), batch_size=32, optimizer=SGD(lr=0.0)))  # weights fixed
    mean, var = np.zeros(4), np.ones(4)
    for k in range(3):
        xb = X[32 * k:32 * (k + 1)]
        vm.set("x", xb)
        vm.set("y", Y[32 * k:32 * (k + 1)])
        vm.train_step("train")
        h = conv_out(vm, xb)
        mean = 0.8 * mean + 0.2 * h.mean(axis=(0, 2, 3))
        var = 0.8 * var + 0.2 * h.var(axis=(0, 2, 3))
        np.testing.assert_allclose(vm.get("m"), mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(vm.get("v"), var, rtol=1e-4, atol=1e-5)


def test_inference_reads_the_running_statistics() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 2, 3))
    vals = {"s": [2.0, 0.5], "b": [1.0, -1.0], "m": [0.5, -2.0], "v": [4.0, 0.25]}
    ps = [g.parameter(k, (2,), init=Init.from_values(v), trainable=False)
          for k, v in vals.items()]
    y = g.path("infer", Mode.FORWARD_ONLY).BatchNormalization(x, *ps, epsilon=0.0)
    vm = VM(compile_graph(g, batch_size=5, keep=[y.name]))
    xs = R.normal(size=(5, 2, 3)).astype(np.float32)
    vm.set("x", xs)
    vm.forward("infer")
    a = {k: np.array(v)[None, :, None] for k, v in vals.items()}
    np.testing.assert_allclose(vm.get(y.name), a["s"] * (xs - a["m"]) / np.sqrt(a["v"]) + a["b"],
                               rtol=1e-6)


def test_running_statistics_are_model_state() -> None:
    """They lead the forward zone with the parameters, so a switch saves and restores
    them; training on after a restore repeats the same statistics."""
    vm = VM(compile_graph(bn_net(), batch_size=32, optimizer=SGD(lr=0.05)))
    train_epoch(vm, X, Y, np.random.default_rng(0))
    saved = vm.save_state()
    stats = vm.get("m"), vm.get("v")
    train_epoch(vm, X, Y, np.random.default_rng(1))
    after = vm.get("m"), vm.get("v")
    assert not np.array_equal(stats[0], after[0])
    vm.load_state(saved)
    assert np.array_equal(vm.get("m"), stats[0]) and np.array_equal(vm.get("v"), stats[1])
    train_epoch(vm, X, Y, np.random.default_rng(1))
    assert np.array_equal(vm.get("m"), after[0]) and np.array_equal(vm.get("v"), after[1])


def test_a_network_with_batch_norm_learns_with_exact_memory() -> None:
    prog = compile_graph(bn_net(momentum=0.5), batch_size=32, optimizer=SGD(lr=0.1, momentum=0.9))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    first = train_epoch(vm, X, Y, np.random.default_rng(0))
    for e in range(30):
        last = train_epoch(vm, X, Y, np.random.default_rng(e + 1))
    assert last < 0.6 * first
    assert evaluate(vm, X, Y) > 0.7  # the eval path, with the running statistics

    def step() -> None:
        vm.train_step("train")
        vm.forward("eval")

    retained, peak = step_allocations(step, warmup=20, runs=100)
    assert retained < 4096 and peak < 16 * 1024


def test_layer_normalization_trains_with_exact_memory() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    y = g.placeholder("y", (0,), dtype="int64")
    w = g.parameter("w", (6, 8), init=Init.xavier_uniform())
    s = g.parameter("s", (8,), init=Init.ones())
    b = g.parameter("b", (8,), init=Init.zeros())
    fc = g.parameter("fc", (8, 3), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Relu(p.LayerNormalization(p.Gemm(x, w), s, b))
    loss, _ = p.SoftmaxCrossEntropyLoss(p.Gemm(h, fc), y, outputs=["loss", "log_prob"])
    p.set_loss(loss)
    prog = compile_graph(g, batch_size=16, optimizer=SGD(lr=0.1))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    xs = R.normal(size=(64, 6)).astype(np.float32)
    ys = xs[:, :3].argmax(axis=1).astype(np.int64)
    first = train_epoch(vm, xs, ys, np.random.default_rng(0))
    for e in range(20):
        last = train_epoch(vm, xs, ys, np.random.default_rng(e + 1))
    assert last < 0.5 * first
    retained, peak = step_allocations(lambda: vm.train_step("train"), warmup=20, runs=100)
    assert retained < 4096 and peak < 16 * 1024


def test_running_statistics_are_not_constants() -> None:
    """Zeros that a BatchNormalization updates are state: ``x + m`` must not be
    simplified to ``x`` because ``m`` starts at zero."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 2))
    s, b = (g.parameter(n, (2,), init=Init.ones()) for n in "sb")
    m = g.parameter("m", (2,), init=Init.zeros(), trainable=False)
    v = g.parameter("v", (2,), init=Init.ones(), trainable=False)
    g.path("stats", Mode.FORWARD_ONLY).BatchNormalization(x, s, b, m, v, training_mode=1,
                                                          running_update=1, momentum=0.0)
    read = g.path("read", Mode.FORWARD_ONLY)
    shifted = read.Relu(read.Add(x, m))
    vm = VM(compile_graph(g, batch_size=2, keep=[shifted.name]))
    vm.set("x", np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
    vm.forward("stats")
    vm.forward("read")
    assert vm.get(shifted.name).tolist() == [[3.0, 6.0], [5.0, 10.0]]
