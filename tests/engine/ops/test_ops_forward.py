"""Forward values: ONNX-named ops against onnx's reference evaluator, the others
against numpy formulas."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from engine import VM, CalcGraph, Mode, compile_graph

R = np.random.default_rng(7)


def run_engine(op: str, inputs: list[np.ndarray], n_out: int = 1, **attrs: Any) -> list:
    g = CalcGraph()
    names = []
    for i, a in enumerate(inputs):
        g.placeholder(f"x{i}", a.shape, dtype=a.dtype.name)
        names.append(f"x{i}")
    p = g.path("f", Mode.FORWARD_ONLY)
    outs = p.op(op, *names, outputs=[f"y{k}" for k in range(n_out)], **attrs)
    vm = VM(compile_graph(g, batch_size=1, debug=True))
    for n, a in zip(names, inputs, strict=True):
        vm.set(n, a)
    vm.forward(0)
    return [vm.get(f"y{k}") for k in range(n_out)] if outs is not None else []


def run_onnx(op: str, inputs: list[np.ndarray], n_out: int = 1, opset: int = 17,
             extra_inputs: dict[str, np.ndarray] | None = None, **attrs: Any) -> list:
    extra_inputs = extra_inputs or {}
    in_names = [f"x{i}" for i in range(len(inputs))] + list(extra_inputs)
    node = helper.make_node(op, in_names, [f"y{k}" for k in range(n_out)], **attrs)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(in_names, [*inputs, *extra_inputs.values()], strict=True)]
    outs = [helper.make_tensor_value_info(f"y{k}", TensorProto.UNDEFINED, None)
            for k in range(n_out)]
    model = helper.make_model(helper.make_graph([node], "t", vi, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: a for n, a in zip(in_names, [*inputs, *extra_inputs.values()], strict=True)}
    return list(ReferenceEvaluator(model).run(None, feeds))


def x(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return R.uniform(low, high, size=shape).astype(np.float32)


UNARY = ["Neg", "Abs", "Exp", "Sin", "Cos", "Sign", "Identity", "Tanh", "Relu", "Sigmoid"]


@pytest.mark.parametrize("op", UNARY)
def test_unary_matches_onnx(op: str) -> None:
    a = x(4, 5)
    np.testing.assert_allclose(run_engine(op, [a])[0], run_onnx(op, [a])[0], rtol=2e-6,
                               atol=2e-7)


@pytest.mark.parametrize("op", ["Log", "Sqrt"])
def test_positive_unary_matches_onnx(op: str) -> None:
    a = x(4, 5, low=0.1)
    np.testing.assert_allclose(run_engine(op, [a])[0], run_onnx(op, [a])[0], rtol=2e-6)


@pytest.mark.parametrize(("op", "attrs"), [("LeakyRelu", {"alpha": 0.2}),
                                           ("Elu", {"alpha": 0.5})])
def test_parametric_activation_matches_onnx(op: str, attrs: dict) -> None:
    a = x(4, 5)
    np.testing.assert_allclose(run_engine(op, [a], **attrs)[0], run_onnx(op, [a], **attrs)[0],
                               rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5))])
def test_binary_broadcasting_matches_onnx(op: str, shapes: tuple) -> None:
    a, b = x(*shapes[0]), x(*shapes[1], low=0.5)
    np.testing.assert_allclose(run_engine(op, [a, b])[0], run_onnx(op, [a, b])[0], rtol=1e-6)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                    ((2, 3, 4), (2, 4, 6))])
def test_matmul_matches_onnx(shapes: tuple) -> None:
    a, b = x(*shapes[0]), x(*shapes[1])
    np.testing.assert_allclose(run_engine("MatMul", [a, b])[0],
                               run_onnx("MatMul", [a, b])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5},
                                   {"transA": 1, "transB": 1, "beta": 2.0}])
def test_gemm_matches_onnx(attrs: dict) -> None:
    a = x(4, 3) if attrs.get("transA") else x(3, 4)
    b = x(5, 4) if attrs.get("transB") else x(4, 5)
    c = x(5)
    np.testing.assert_allclose(run_engine("Gemm", [a, b, c], **attrs)[0],
                               run_onnx("Gemm", [a, b, c], **attrs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize(("axes", "keepdims"), [((1,), 1), ((0, 2), 0), ((-1,), 0), (None, 1)])
def test_reduce_matches_onnx(op: str, axes: tuple | None, keepdims: int) -> None:
    a = x(3, 4, 5)
    extra = {"axes": np.array(axes, dtype=np.int64)} if axes is not None else {}
    ours = run_engine(op, [a], axes=axes, keepdims=keepdims)[0]
    ref = run_onnx(op, [a], opset=18, extra_inputs=extra, keepdims=keepdims)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_family_matches_onnx(op: str, axis: int) -> None:
    a = x(3, 4, 5) * 10
    np.testing.assert_allclose(run_engine(op, [a], axis=axis)[0],
                               run_onnx(op, [a], axis=axis)[0], rtol=1e-5, atol=1e-6)


def test_reshape_and_flatten_match_onnx() -> None:
    a = x(2, 3, 4)
    ref = run_onnx("Reshape", [a], extra_inputs={"s": np.array([4, 0, -1], np.int64)})[0]
    np.testing.assert_array_equal(run_engine("Reshape", [a], shape=(4, 0, -1))[0], ref)
    for axis in (0, 1, 2, 3):
        np.testing.assert_array_equal(run_engine("Flatten", [a], axis=axis)[0],
                                      run_onnx("Flatten", [a], axis=axis)[0])


CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [2, 1, 0, 1]}),
    ((2, 2, 9, 7), (3, 2, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 2, 9, 7), (3, 2, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 2, 5, 5), (3, 2, 1, 1), {"auto_pad": "VALID"}),
]


@pytest.mark.parametrize(("xs", "ws", "attrs"), CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_matches_onnx(xs: tuple, ws: tuple, attrs: dict, bias: bool) -> None:
    ins = [x(*xs), x(*ws)] + ([x(ws[0])] if bias else [])
    ours = run_engine("Conv", ins, **{k: tuple(v) if isinstance(v, list) else v
                                      for k, v in attrs.items()})[0]
    np.testing.assert_allclose(ours, run_onnx("Conv", ins, **attrs)[0], rtol=1e-4, atol=1e-4)


POOL_CASES = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
]


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_matches_onnx(op: str, attrs: dict) -> None:
    if op == "AveragePool" and "dilations" in attrs:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    a = x(2, 3, 7, 6)
    ours = run_engine(op, [a], **{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in attrs.items()})[0]
    np.testing.assert_allclose(ours, run_onnx(op, [a], **attrs)[0], rtol=1e-5, atol=1e-6)


def test_average_pool_counting_the_padding_matches_onnx() -> None:
    a = x(1, 2, 5, 5)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    ours = run_engine("AveragePool", [a], kernel_shape=(3, 3), pads=(1, 1, 1, 1),
                      count_include_pad=1)[0]
    # atol too: a window whose values nearly cancel has a mean near 0, where the two
    # summation orders differ by float32 rounding of the terms (|x| <= 3), not relatively
    np.testing.assert_allclose(ours, run_onnx("AveragePool", [a], **attrs)[0], rtol=1e-5,
                               atol=1e-6)


def test_global_average_pool_matches_onnx() -> None:
    a = x(2, 3, 4, 5)
    np.testing.assert_allclose(run_engine("GlobalAveragePool", [a])[0],
                               run_onnx("GlobalAveragePool", [a])[0], rtol=1e-6)


@pytest.mark.parametrize("perm", [(), (2, 0, 1), (0, 2, 1)])
def test_transpose_matches_onnx(perm: tuple[int, ...]) -> None:
    a = x(2, 3, 4)
    attrs = {"perm": perm} if perm else {}
    np.testing.assert_array_equal(run_engine("Transpose", [a], **attrs)[0],
                                  run_onnx("Transpose", [a], **attrs)[0])


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh"])
def test_fused_gemm_is_gemm_then_activation(activation: str) -> None:
    a, b, c = x(4, 3), x(5, 4), x(5)
    z = run_onnx("Gemm", [a, b, c], transA=1, transB=1, alpha=0.5)[0]
    ref = run_onnx(activation, [z])[0]
    ours = run_engine("FusedGemm", [a, b, c], transA=1, transB=1, alpha=0.5,
                      activation=activation)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_softmax_cross_entropy_matches_onnx(reduction: str) -> None:
    s = x(6, 4)
    lab = np.array([0, 3, 1, 1, 2, 0], dtype=np.int64)
    loss, logp = run_engine("SoftmaxCrossEntropyLoss", [s, lab], n_out=2, reduction=reduction)
    ref_loss, ref_logp = run_onnx("SoftmaxCrossEntropyLoss", [s, lab], n_out=2,
                                  reduction=reduction)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-6)


def test_dropout_eval_is_identity_like_onnx() -> None:
    a = x(4, 5)
    y, mask = run_engine("Dropout", [a], n_out=2, ratio=0.5, training=0)
    np.testing.assert_array_equal(y, run_onnx("Dropout", [a])[0])
    assert mask.dtype == np.bool_ and mask.all()


def test_dropout_training_keeps_about_one_minus_ratio_and_rescales() -> None:
    a = np.ones((200, 50), dtype=np.float32)
    y, mask = run_engine("Dropout", [a], n_out=2, ratio=0.25, training=1)
    assert abs(mask.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[mask], 1 / 0.75, rtol=1e-6)
    assert (y[~mask] == 0).all()


def test_square_mse_rmse_accuracy_match_numpy() -> None:
    p, t = x(5, 3), x(5, 3)
    np.testing.assert_allclose(run_engine("Square", [p])[0], p * p, rtol=1e-6)
    np.testing.assert_allclose(run_engine("MSELoss", [p, t])[0], np.mean((p - t) ** 2),
                               rtol=1e-5)
    np.testing.assert_allclose(run_engine("RMSE", [p, t])[0],
                               np.sqrt(np.mean((p - t) ** 2)), rtol=1e-5)
    lab = np.array([0, 1, 2, 0, 1], dtype=np.int64)
    expected = np.mean(np.argmax(p, axis=1) == lab)
    np.testing.assert_allclose(run_engine("Accuracy", [p, lab])[0], expected, rtol=1e-6)


def test_onnx_is_importable_for_the_reference() -> None:
    assert onnx.defs.onnx_opset_version() >= 17


@pytest.mark.parametrize("bad", [-1, 4])
def test_cross_entropy_rejects_labels_out_of_range(bad: int) -> None:
    from engine import InputError

    lab = np.array([0, bad, 1], dtype=np.int64)
    with pytest.raises(InputError, match=r"labels must lie in \[0, 4\)"):
        run_engine("SoftmaxCrossEntropyLoss", [x(3, 4), lab], n_out=2)
