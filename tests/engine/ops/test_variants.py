"""Every kernel variant of every op that has them (inner variants too: ``im2col/tn``)
against the others: the same values and gradients within float32 rounding, its own
exact workspace (allocated = planned), and no allocation in a training step.

A variant runs by naming it (``algorithm=``); a grouped variant (a dense layer's
layout, a stacked layer's form) named on the forward op carries over to its gradient
ops, so the gradients are checked under each variant too.  Conv's own cases are in
``test_conv_algorithms.py``; this file holds one case per op, and a test that no op with
variants lacks one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine import SGD, VM, CalcGraph, DType, Init, Kind, Mode, TensorDesc, compile_graph
from engine.ops import OP_TABLE, get_op
from engine.ops._base import VARIANT_ATTR, applicable_variants, variant_leaves
from tests.allocations import step_allocations

Case = Callable[[str], tuple[CalcGraph, dict[str, np.ndarray], list[str]]]


def _data(size: tuple[int, ...]) -> np.ndarray:
    """The same inputs for every variant of a case."""
    return np.random.default_rng(11).normal(size=size)


def _head(g: CalcGraph, p: Any, h: Any, features: int) -> None:
    """A linear head and a cross-entropy loss on ``h`` ([b, features])."""
    w = g.parameter("head", (features, 3), init=Init.xavier_uniform())
    y = g.placeholder("y", (0,), dtype="int64")
    loss, _ = p.SoftmaxCrossEntropyLoss(p.MatMul(h, w), y, outputs=["loss", "log_prob"])
    p.set_loss(loss)


def _conv(name: str) -> tuple[CalcGraph, dict[str, np.ndarray], list[str]]:
    g = CalcGraph()
    x = g.placeholder("x", (0, 3, 8, 8))
    w = g.parameter("w", (4, 3, 3, 3), init=Init.he_uniform())
    b = g.parameter("b", (4,), init=Init.uniform(-0.5, 0.5))
    p = g.path("train", Mode.BACKWARD_ENABLED)
    y = p.Conv(x, w, b, pads=(1, 1, 1, 1), algorithm=name, outputs=["out"])
    _head(g, p, p.Flatten(p.Relu(y)), 4 * 64)
    return g, {"x": _data((4, 3, 8, 8)).astype(np.float32)}, ["out", "w", "b"]


def _gemm(name: str) -> tuple[CalcGraph, dict[str, np.ndarray], list[str]]:
    g = CalcGraph()
    x = g.placeholder("x", (0, 12))
    w = g.parameter("w", (7, 12), init=Init.xavier_uniform())  # [out, in]: transB
    b = g.parameter("b", (7,), init=Init.uniform(-0.5, 0.5))
    w2 = g.parameter("w2", (7, 5), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Gemm(x, w, b, transB=1, alpha=0.5, beta=2.0, algorithm=name, outputs=["out"])
    h2 = p.Gemm(p.Tanh(h), w2, algorithm=name, outputs=["out2"])
    _head(g, p, h2, 5)
    return g, {"x": _data((6, 12)).astype(np.float32)}, ["out", "out2", "w", "b", "w2"]


PADDED = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 1, 1)}
TILED_2X2 = {"kernel_shape": (2, 2), "strides": (2, 2)}  # floored: 9 = 2·4 + 1


def _pool(op: str, window: dict[str, Any] = PADDED) -> Case:
    def case(name: str) -> tuple[CalcGraph, dict[str, np.ndarray], list[str]]:
        g = CalcGraph()
        x = g.placeholder("x", (0, 2, 9, 9))
        w = g.parameter("w", (2, 2, 1, 1), init=Init.he_uniform())
        p = g.path("train", Mode.BACKWARD_ENABLED)
        h = p.Conv(x, w)  # a parameter before the pooling, so its gradient is checked
        y = p.op(op, h, **window, algorithm=name, outputs=["out"])
        _head(g, p, p.Flatten(y), 2 * (5 * 4 if window is PADDED else 4 * 4))
        return g, {"x": _data((4, 2, 9, 9)).astype(np.float32)}, ["out", "w"]

    return case


def _stacked(name: str) -> tuple[CalcGraph, dict[str, np.ndarray], list[str]]:
    """Two models, 3 layers: shared data into [K, out, in] weights (transB), a stacked
    input into [K, in, out] weights, and a stacked input into [K, out, in]."""
    k = 2
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    y = g.placeholder("y", (0,), dtype="int64")
    w1 = g.parameter("w1", (k, 5, 6), init=Init.xavier_uniform())
    b1 = g.parameter("b1", (k, 5), init=Init.uniform(-0.5, 0.5))
    w2 = g.parameter("w2", (k, 5, 4), init=Init.xavier_uniform())
    w3 = g.parameter("w3", (k, 3, 4), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Tanh(p.StackedGemm(x, w1, b1, transB=1, algorithm=name, outputs=["out"]))
    h = p.Tanh(p.StackedGemm(h, w2, algorithm=name, outputs=["out2"]))
    s = p.StackedGemm(h, w3, transB=1, algorithm=name, outputs=["out3"])
    losses, _ = p.StackedSoftmaxCrossEntropyLoss(s, y, outputs=["losses", "log_prob"])
    p.set_loss(p.ReduceSum(losses, keepdims=0))
    return g, {"x": _data((5, 6)).astype(np.float32)}, \
        ["out", "out2", "out3", "w1", "b1", "w2", "w3"]


def _interleaved(name: str) -> tuple[CalcGraph, dict[str, np.ndarray], list[str]]:
    """Three models, shared data (two thirds zeros, one row all zeros) into a weight
    [in, K, out] (model_axis=1: the layout that offers the sparse form), then a
    stacked head."""
    k = 3
    g = CalcGraph()
    x = g.placeholder("x", (0, 7))
    y = g.placeholder("y", (0,), dtype="int64")
    w1 = g.parameter("w1", (7, k, 5), init=Init.xavier_uniform())
    b1 = g.parameter("b1", (k, 5), init=Init.uniform(-0.5, 0.5))
    w2 = g.parameter("w2", (k, 5, 3), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Tanh(p.StackedGemm(x, w1, b1, model_axis=1, algorithm=name, outputs=["out"]))
    s = p.StackedGemm(h, w2, outputs=["out2"])
    losses, _ = p.StackedSoftmaxCrossEntropyLoss(s, y, outputs=["losses", "log_prob"])
    p.set_loss(p.ReduceSum(losses, keepdims=0))
    data = _data((6, 7)).astype(np.float32)
    data[np.arange(42).reshape(6, 7) % 3 != 0] = 0.0
    data[2] = 0.0
    return g, {"x": data}, ["out", "out2", "w1", "b1", "w2"]


CASES: dict[str, Case] = {
    "Conv": _conv,
    "Gemm": _gemm,
    "MaxPool": _pool("MaxPool", TILED_2X2),  # where every variant applies
    "MaxPool:padded": _pool("MaxPool"),  # overlapping windows: not the 2x2 kernel's
    "AveragePool": _pool("AveragePool"),
    "StackedGemm": _stacked,
    "StackedGemm:interleaved": _interleaved,  # shared data into [in, K, out]
}
# gradient ops whose variants their forward op's case runs (a group names them)
COVERED_BY: dict[str, str] = {"StackedGemmGradInput": "StackedGemm",
                              "StackedGemmGradWeight": "StackedGemm"}


# the elementwise ops whose variants are a numpy kernel and its fused (numba) form:
# test_fused_kernels.py runs each such op's two kernels against each other directly
FUSED_PAIR = {"numpy", "numba"}


def test_every_op_with_variants_has_a_case() -> None:
    missing = [n for n, op in OP_TABLE.items()
               if len(variant_leaves(op.variants)) > 1 and n not in CASES
               and n not in COVERED_BY and set(variant_leaves(op.variants)) != FUSED_PAIR]
    assert not missing, f"add a case for {missing} to CASES"


def run_case(case: Case, name: str, device: str = "cpu") -> tuple[dict[str, np.ndarray], VM]:
    """The case's values and gradients after one forward and backward under variant
    ``name``, and its VM."""
    g, feed, names = case(name)
    batch = len(next(iter(feed.values())))
    feed = {**feed, "y": np.arange(batch) % 3}
    values = [n for n in names if g.variables[n].kind is Kind.GENERIC]
    prog = compile_graph(g, batch_size=batch, optimizer=SGD(lr=0.1), keep=values,
                         device=device)
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    vm.feed(feed)
    vm.forward("train")
    vm.apply_loss("train")
    vm.backward("train")
    out = {n: vm.get(n) for n in values}
    out.update({f"d{n}": vm.grad(n) for n in names if n not in values})
    return out, vm


# a case's variants where not all of its op's apply to it
CASE_VARIANTS: dict[str, list[str]] = {"MaxPool:padded": ["views", "copies"],
                                       "StackedGemm": ["blas", "batched"],
                                       "StackedGemm:interleaved": ["blas", "sparse"]}


def leaves(case: str) -> list[str]:
    """The variants a case runs: its op's (the key before any ``:label``)."""
    return CASE_VARIANTS.get(case) or variant_leaves(get_op(case.split(":")[0]).variants)


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_variant_gives_the_same_values_and_gradients(op: str) -> None:
    results = {name: run_case(CASES[op], name)[0] for name in leaves(op)}
    ref_name, ref = next(iter(results.items()))
    for name, got in results.items():
        for key, value in ref.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{op} {name} vs {ref_name}: {key}")


@pytest.mark.parametrize("op, name", [(op, name) for op in sorted(CASES) for name in leaves(op)])
def test_a_training_step_under_each_variant_allocates_nothing(op: str, name: str) -> None:
    _, vm = run_case(CASES[op], name)
    retained, peak = step_allocations(lambda: vm.train_step("train"), warmup=5, runs=20)
    assert retained < 4096 and peak <= 3 * 8192 * 4 + 4096, (retained, peak)


def test_a_grouped_variant_carries_over_to_the_gradient_ops() -> None:
    g, _, _ = _gemm("transposed")
    prog = compile_graph(g, batch_size=4, optimizer=SGD(lr=0.1))
    gemms = [i.attrs.get(VARIANT_ATTR) for i in prog.instrs if i.op == "Gemm"]
    # the two layers' products and their 3 gradients; the head's gradients (of a MatMul,
    # which has no layouts) keep the default
    assert gemms.count("transposed") == 5 and gemms.count(None) == 2


def test_window_copies_do_not_apply_to_max_pool_indices() -> None:
    op = get_op("MaxPool")
    x = TensorDesc(DType.FLOAT32, (1, 1, 4, 4))
    attrs = {**op.attrs, "kernel_shape": (2, 2)}
    outs = op.shape([x], attrs)
    assert applicable_variants(op, [x], outs[:1], attrs) == ("views", "copies")
    assert applicable_variants(op, [x], outs, attrs) == ("views",)
