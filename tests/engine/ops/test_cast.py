"""Cast and DequantizeLinear: values, gradients, exact memory, and compact data sets."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, CalcGraph, Init, Mode, compile_graph
from engine.errors import ShapeError
from explore.datasets import DataError, load_digits, quantize
from tests.allocations import step_allocations


def run(x: np.ndarray, op: str, **attrs: object) -> np.ndarray:
    g = CalcGraph()
    p = g.placeholder("x", x.shape, dtype=x.dtype.name)
    y = g.path("infer", Mode.FORWARD_ONLY).op(op, p, **attrs)
    vm = VM(compile_graph(g, batch_size=1, keep=[y.name]))
    vm.set("x", x)
    vm.forward("infer")
    return vm.get(y.name)


@pytest.mark.parametrize("to", ["float64", "int64", "int32", "int8", "uint8", "bool", 7, 9])
def test_cast_matches_numpy(to: object) -> None:
    x = np.array([[-2.7, -0.5, 0.0, 0.5, 3.9, 100.2]], np.float32)
    got = run(x, "Cast", to=to)
    name = {7: "int64", 9: "bool"}.get(to, to)  # type: ignore[call-overload]
    want = (x != 0) if name == "bool" else x.astype(name)  # truncation toward zero
    assert got.dtype == np.dtype(name) and np.array_equal(got, want)


def test_cast_from_integers_and_bools() -> None:
    x = np.array([[0, 1, 255]], np.uint8)
    assert run(x, "Cast", to="float32").tolist() == [[0.0, 1.0, 255.0]]
    assert run(np.array([[True, False]]), "Cast", to="int64").tolist() == [[1, 0]]


def test_cast_rejects_unknown_types() -> None:
    with pytest.raises(ShapeError, match="ONNX element type 10"):
        run(np.zeros((1, 2), np.float32), "Cast", to=10)
    with pytest.raises(ShapeError, match="unknown dtype"):
        run(np.zeros((1, 2), np.float32), "Cast", to="float16")


def test_the_gradient_of_a_cast_is_cast_back() -> None:
    g = CalcGraph()
    w0 = np.array([[0.5, -1.25, 2.0]], np.float32)
    w = g.parameter("w", (1, 3), init=Init.from_values(w0.ravel().tolist()))
    p = g.path("train", Mode.BACKWARD_ENABLED)
    y = p.Cast(w, to="float64")
    p.set_loss(p.ReduceSum(p.Mul(y, y), keepdims=0))
    vm = VM(compile_graph(g, batch_size=1, optimizer=SGD(lr=0.25)))
    vm.train_step("train")
    # d/dw sum(w^2) = 2w, so one step of lr 0.25 halves w exactly.
    assert np.array_equal(vm.get("w"), w0 / 2)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32"])
def test_dequantize_per_tensor(dtype: str) -> None:
    x = np.array([[0, 3, 100, 127]], dtype)
    got = run(x, "DequantizeLinear", scale=0.25, zero_point=3)
    assert got.dtype == np.float32
    assert np.array_equal(got, (x.astype(np.float32) - 3) * np.float32(0.25))


def test_dequantize_per_axis_and_in_blocks() -> None:
    x = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    scale, zero = (0.5, 1.0, 2.0), (1, 0, 2)
    got = run(x, "DequantizeLinear", scale=scale, zero_point=zero, axis=1)
    want = (x - np.array(zero, np.float32)[:, None]) * np.array(scale, np.float32)[:, None]
    assert np.array_equal(got, want)
    blocks = tuple(float(v) for v in np.arange(1, 13) / 4)  # (2, 3, 2): blocks of 2 on axis 2
    got = run(x, "DequantizeLinear", scale=blocks, axis=2, block_size=2)
    want = x * np.repeat(np.array(blocks, np.float32).reshape(2, 3, 2), 2, axis=2)
    assert np.array_equal(got, want)
    with pytest.raises(ShapeError, match="2 scales for axis 1 of length 3"):
        run(x, "DequantizeLinear", scale=(1.0, 2.0), axis=1)
    with pytest.raises(ShapeError, match="takes uint8, int8 or int32"):
        run(x.astype(np.float32), "DequantizeLinear", scale=1.0)


def test_a_step_that_dequantizes_allocates_nothing_and_is_exact() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 64), dtype="uint8")
    w = g.parameter("w", (64, 8), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Gemm(p.DequantizeLinear(x, scale=1 / 16), w)
    p.set_loss(p.ReduceSum(p.Mul(h, h), keepdims=0))
    prog = compile_graph(g, batch_size=32, optimizer=SGD(lr=1e-6))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    data = quantize(load_digits().train.x, 1 / 16)
    rows = np.arange(32)

    def step() -> None:
        vm.gather("x", data, rows, check=False)
        vm.train_step("train")

    # numpy builds and caches its uint8 -> float32 cast on the first calls: warm up longer
    retained, peak = step_allocations(step, warmup=50, runs=200)
    assert retained < 4096 and peak < 4096


def test_quantize_is_exact_or_refuses() -> None:
    x = load_digits().train.x
    q = quantize(x, 1 / 16)
    assert q.dtype == np.uint8 and np.array_equal(q.astype(np.float32) * np.float32(1 / 16), x)
    with pytest.raises(DataError, match=r"not a multiple of 0\.0625"):
        quantize(x + np.float32(0.01), 1 / 16)
    with pytest.raises(DataError, match="not pixels"):
        quantize(x * 100, 1 / 16)
