"""Conv's forward algorithms give the same results, each with its own exact workspace,
and none allocates in a step."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, CalcGraph, DType, Init, Mode, ShapeError, TensorDesc, compile_graph
from engine.ops import get_op
from tests.allocations import step_allocations

R = np.random.default_rng(5)

ALGORITHMS = tuple(get_op("Conv").variants)  # every registered variant
SHAPES = [  # (x, w, attrs): the algorithms that apply to each
    ((2, 3, 9, 7), (4, 3, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 3, 8, 8), (4, 3, 3, 3), {}),
    ((1, 2, 5, 6), (3, 2, 3, 3), {"pads": (0, 2, 1, 0)}),
    ((2, 4, 9, 9), (6, 2, 3, 2), {"strides": (2, 1), "dilations": (1, 2), "group": 2,
                                  "pads": (1, 0, 0, 1)}),
    ((1, 3, 10, 10), (5, 3, 5, 5), {"strides": (2, 2), "pads": (2, 2, 2, 2)}),
]


def applicable(x: tuple[int, ...], w: tuple[int, ...], attrs: dict) -> list[str]:
    """The registered variants whose own ``applies`` accepts this convolution."""
    op = get_op("Conv")
    full = {**op.attrs, **attrs}
    ins = [TensorDesc(DType.FLOAT32, x), TensorDesc(DType.FLOAT32, w)]
    outs = op.shape(ins, full)
    return [name for name, v in op.variants.items() if v.applies(ins, outs, full)]


def test_applicability_is_the_variants_own() -> None:
    assert applicable((2, 3, 8, 8), (4, 3, 3, 3), {}) == list(ALGORITHMS)
    assert "winograd" not in applicable((2, 3, 8, 8), (4, 3, 3, 3), {"strides": (2, 2)})
    assert "winograd" not in applicable((2, 3, 8, 8), (4, 3, 5, 5), {})


def run(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict, algorithm: str
        ) -> tuple[np.ndarray, int]:
    g = CalcGraph()
    xv = g.placeholder("x", x.shape)
    wv = g.parameter("w", w.shape, init=Init.from_array(w), trainable=False)
    bv = g.parameter("b", b.shape, init=Init.from_array(b), trainable=False)
    y = g.path("c", Mode.FORWARD_ONLY).Conv(xv, wv, bv, algorithm=algorithm, **attrs)
    prog = compile_graph(g, batch_size=x.shape[0], keep=[y.name])
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    vm.set("x", x)
    vm.forward("c")
    return vm.get(y.name), prog.zone_bytes["workspace"]


@pytest.mark.parametrize("x_shape, w_shape, attrs", SHAPES)
def test_every_algorithm_gives_the_same_result(x_shape: tuple, w_shape: tuple,
                                               attrs: dict) -> None:
    x = R.normal(size=x_shape).astype(np.float32)
    w = R.normal(size=w_shape).astype(np.float32)
    b = R.normal(size=w_shape[0]).astype(np.float32)
    results = {a: run(x, w, b, attrs, a) for a in applicable(x_shape, w_shape, attrs)}
    ref, _ = results["im2col"]
    for a, (y, _) in results.items():
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4, err_msg=a)


def test_each_algorithm_declares_its_own_workspace() -> None:
    """direct keeps one kernel position's input where im2col keeps all nine."""
    x = R.normal(size=(8, 16, 14, 14)).astype(np.float32)
    w = R.normal(size=(16, 16, 3, 3)).astype(np.float32)
    b = np.zeros(16, np.float32)
    ws = {a: run(x, w, b, {"pads": (1, 1, 1, 1)}, a)[1] for a in ALGORITHMS}
    assert len(set(ws.values())) == 3
    assert ws["direct"] < ws["im2col"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_training_step_allocates_nothing(algorithm: str) -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 3, 8, 8))
    y = g.placeholder("y", (0,), dtype="int64")
    w = g.parameter("w", (4, 3, 3, 3), init=Init.he_uniform())
    fc = g.parameter("fc", (4 * 8 * 8, 5), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Flatten(p.Relu(p.Conv(x, w, pads=(1, 1, 1, 1), algorithm=algorithm)))
    loss, _ = p.SoftmaxCrossEntropyLoss(p.Gemm(h, fc), y, outputs=["loss", "log_prob"])
    p.set_loss(loss)
    vm = VM(compile_graph(g, batch_size=4, optimizer=SGD(lr=0.01)))
    vm.set("x", R.normal(size=(4, 3, 8, 8)).astype(np.float32))
    vm.set("y", np.array([0, 1, 2, 3]))
    retained, peak = step_allocations(lambda: vm.train_step("train"), warmup=5, runs=20)
    assert retained < 4096 and peak <= 3 * 8192 * 4 + 4096


def test_winograd_refuses_what_it_cannot_do() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (1, 2, 6, 6))
    w = g.placeholder("w", (2, 2, 3, 3))
    g.path("c", Mode.FORWARD_ONLY).Conv(x, w, strides=(2, 2), algorithm="winograd")
    with pytest.raises(ShapeError, match="needs a 3x3 kernel, stride"):
        compile_graph(g, batch_size=1)


def test_max_pool_gradient_goes_to_the_first_of_tied_maxima() -> None:
    g = CalcGraph()
    w = g.parameter("w", (1, 1, 2, 4), init=Init.from_values([1, 1, 0, 2, 1, 0, 2, 2]))
    p = g.path("train", Mode.BACKWARD_ENABLED)
    m = p.MaxPool(w, kernel_shape=(2, 2), strides=(2, 2))
    p.set_loss(p.ReduceSum(m, keepdims=0))
    vm = VM(compile_graph(g, batch_size=1, optimizer=SGD(lr=1.0)))
    vm.forward("train")
    vm.apply_loss("train")
    vm.backward("train")
    # windows [[1, 1], [1, 0]] and [[0, 2], [2, 2]]: their first maxima in row order
    assert vm.grad("w").reshape(2, 4).tolist() == [[1, 0, 0, 1], [0, 0, 0, 0]]


def test_an_unknown_algorithm_lists_the_registered_ones() -> None:
    g = CalcGraph()
    x, w = g.placeholder("x", (1, 1, 4, 4)), g.placeholder("w", (1, 1, 3, 3))
    g.path("c", Mode.FORWARD_ONLY).Conv(x, w, algorithm="fft")
    with pytest.raises(ShapeError, match="'fft' is not one of im2col, direct, winograd"):
        compile_graph(g, batch_size=1)
