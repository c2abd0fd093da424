"""Every op declares its FLOPs, and each rule agrees with a direct count.

The products (MatMul, MatMulT, Gemm, FusedGemm, Conv, ConvTranspose and their
gradients) are checked twice: against PyTorch's ``FlopCounterMode`` running the same
op, and against a literal loop on tiny shapes that computes the op (its result checked
against PyTorch's) while counting each multiply and add.  Every other op is checked
against a hand count for a few shapes, broadcasting and a batch of 1 among them; a
test fails if an op has no case here.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from engine.graph import DType, TensorDesc
from engine.ops import OP_TABLE

F32 = DType.FLOAT32


def t(*shape: int, dtype: DType = F32) -> TensorDesc:
    return TensorDesc(dtype, tuple(shape))


def i64(*shape: int) -> TensorDesc:
    return t(*shape, dtype=DType.INT64)


def u8(*shape: int) -> TensorDesc:
    return t(*shape, dtype=DType.UINT8)


def flops(name: str, ins: list[TensorDesc], **attrs: Any) -> int:
    """``name``'s FLOP rule at these inputs, its outputs from its shape rule."""
    op = OP_TABLE[name]
    full = op.with_defaults(attrs)
    return op.flops(ins, op.shape(ins, full), full)  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(OP_TABLE))
def test_every_op_declares_a_flop_rule(name: str) -> None:
    assert callable(OP_TABLE[name].flops), f"{name} declares no FLOP rule (OpDef.flops)"


# -- hand counts -------------------------------------------------------------------------

UNARY = ("Neg", "Abs", "Exp", "Log", "Sqrt", "Square", "Sin", "Cos", "Sign", "Tanh", "Relu",
         "Sigmoid", "LeakyRelu", "Elu", "Floor", "Ceil", "Reciprocal", "Softplus", "Softsign",
         "HardSigmoid", "Gelu", "Erf", "HardSwish", "Mish", "Selu", "Celu")
BINARY = ("Add", "Sub", "Mul", "Div", "Pow")
MOVES = ("Identity", "Cast", "Expand", "Concat", "Split", "Squeeze", "Unsqueeze", "Transpose",
         "Reshape", "Flatten", "Slice", "SliceGrad", "Pad", "Gather", "Shape", "ConstantOfShape")

# (op, inputs, attributes, FLOPs counted by hand)
HAND: list[tuple[str, list[TensorDesc], dict[str, Any], int]] = [
    *[(op, [t(3, 4)], {}, 12) for op in UNARY],
    *[(op, [t(1, 5)], {}, 5) for op in UNARY],
    *[(op, [t(3, 1), t(1, 4)], {}, 12) for op in BINARY],  # broadcast both ways
    *[(op, [t(1, 4), t(4)], {}, 4) for op in BINARY],
    ("InstanceNormalization", [t(2, 3, 4, 5), t(3), t(3)], {}, 8 * 120),  # 8 an element
    ("PRelu", [t(3, 4), t(4)], {}, 24),  # a product and a sum per element
    ("GeluGrad", [t(3, 4), t(3, 4)], {}, 60),  # dy (Phi(x) + x phi(x)): 5 per element
    ("Identity", [t(3, 4)], {}, 0),
    ("Resize", [t(1, 2, 3, 4)], {"factors": (1, 1, 2, 2)}, 0),
    ("Cast", [t(3, 4)], {"to": "float64"}, 0),
    ("Expand", [t(1, 4), t(3, 4)], {}, 0),
    ("Concat", [t(2, 3), t(2, 5)], {"axis": 1}, 0),
    ("Split", [t(2, 6)], {"axis": 1, "num_outputs": 2}, 0),
    ("Squeeze", [t(2, 1, 3)], {"axes": (1,)}, 0),
    ("Unsqueeze", [t(2, 3)], {"axes": (1,)}, 0),
    ("Transpose", [t(2, 3, 4)], {"perm": (2, 0, 1)}, 0),
    ("Reshape", [t(2, 3, 4)], {"shape": (2, 12)}, 0),
    ("Flatten", [t(2, 3, 4)], {"axis": 1}, 0),
    ("Slice", [t(4, 6)], {"starts": (1,), "ends": (5,), "axes": (1,)}, 0),
    ("SliceGrad", [t(4, 4), t(4, 6)], {"starts": (1,), "ends": (5,), "axes": (1,)}, 0),
    ("Pad", [t(2, 4)], {"pads": (0, 1, 0, 1), "mode": "reflect"}, 0),
    ("Gather", [t(5, 3), i64(4)], {"axis": 0}, 0),
    ("Shape", [t(2, 3)], {}, 0),
    ("ConstantOfShape", [], {"shape": (2, 3)}, 0),
    # SumTo and reductions: 1 per input element
    ("SumTo", [t(3, 4)], {"axes": (0,), "shape": (4,)}, 12),
    ("SumTo", [t(2, 3, 4)], {"axes": (0, 2), "shape": (3, 1)}, 24),
    ("SumTo", [t(1, 4)], {"axes": (0,), "shape": (4,)}, 4),
    ("ReduceSum", [t(2, 3, 4)], {"axes": (1,)}, 24),
    ("ReduceSum", [t(2, 3, 4)], {}, 24),
    ("ReduceSum", [t(2, 3)], {"axes": (), "noop_with_empty_axes": 1}, 0),  # a copy
    ("ReduceMean", [t(1, 5)], {"axes": (1,), "keepdims": 0}, 5),
    ("ReduceGrad", [t(2, 1, 4), t(2, 3, 4)], {"axes": (1,), "mean": 1}, 24),
    ("ReduceGrad", [t(2, 1, 4), t(2, 3, 4)], {"axes": (1,), "mean": 0}, 0),
    ("ReduceMax", [t(2, 3, 4)], {"axes": (2,)}, 24),
    ("ReduceMin", [t(2, 3)], {}, 6),
    ("ReduceProd", [t(1, 3)], {"axes": (1,)}, 3),
    ("ReduceL1", [t(2, 3, 4)], {"axes": (2,)}, 48),
    ("ReduceL2", [t(2, 3)], {}, 12),
    ("ReduceLogSum", [t(2, 3)], {"axes": (1,)}, 6),
    ("ReduceLogSumExp", [t(2, 3)], {"axes": (1,)}, 24),
    ("ReduceSumSquare", [t(2, 3)], {"axes": (0,)}, 12),
    ("ReduceSumSquare", [t(2, 3)], {"axes": (), "noop_with_empty_axes": 1}, 6),  # squares
    ("ReduceFamilyGrad", [t(2, 1), t(2, 3), t(2, 1)], {"kind": "max", "axes": (1,)}, 6),
    ("ReduceFamilyGrad", [t(2, 1), t(2, 3), t(2, 1)], {"kind": "l2", "axes": (1,)}, 12),
    ("ReduceFamilyGrad", [t(2, 1), t(2, 3), t(2, 1)], {"kind": "log_sum_exp", "axes": (1,)}, 18),
    ("ArgMax", [t(4, 5)], {"axis": 1}, 20),
    ("Hardmax", [t(4, 5)], {"axis": 1}, 20),
    ("GlobalAveragePool", [t(2, 3, 4, 4)], {}, 96),
    # softmax family: 5 per element, gradients 4
    ("Softmax", [t(2, 5)], {}, 50),
    ("Softmax", [t(1, 7)], {}, 35),
    ("LogSoftmax", [t(2, 5)], {}, 50),
    ("SoftmaxGrad", [t(2, 5), t(2, 5)], {}, 40),
    ("LogSoftmaxGrad", [t(2, 5), t(2, 5)], {}, 40),
    # elementwise gradients: the formula's operations
    ("SigmoidGrad", [t(2, 5), t(2, 5)], {}, 30),  # dy * y * (1 - y)
    ("TanhGrad", [t(2, 5), t(2, 5)], {}, 30),  # dy * (1 - y * y)
    ("ReluGrad", [t(2, 5), t(2, 5)], {}, 10),
    ("LeakyReluGrad", [t(1, 5), t(1, 5)], {}, 5),
    ("EluGrad", [t(2, 5), t(2, 5), t(2, 5)], {}, 20),  # dy * (y + alpha) where x <= 0
    ("Sum", [t(2, 3), t(2, 3), t(3)], {}, 12),
    ("Sum", [t(2, 3)], {}, 0),
    ("Max", [t(2, 3), t(1, 3)], {}, 6),
    ("Min", [t(2, 3), t(2, 1), t(2, 3)], {}, 12),
    ("SelectGrad", [t(2, 3), t(2, 3), t(2, 3)], {"pick": 0, "kind": "max"}, 6),
    ("Clip", [t(2, 3)], {"min": 0.0, "max": 1.0}, 6),
    ("Clip", [t(2, 3)], {"max": 1.0}, 6),
    ("Clip", [t(2, 3)], {}, 0),  # unbounded: a copy
    ("ClipGrad", [t(2, 3), t(2, 3)], {"min": 0.0}, 6),
    ("Where", [t(2, 1, dtype=DType.BOOL), t(1, 3), t(3)], {}, 6),
    ("WhereGrad", [t(2, 1, dtype=DType.BOOL), t(2, 3)], {"pick": 1}, 6),
    # a comparison: one per output element, broadcast or not; Not one per element
    ("Equal", [t(2, 1), t(1, 3)], {}, 6),
    ("Less", [t(4, 3), t(3)], {}, 12),
    ("LessOrEqual", [t(2, 3), t(2, 3)], {}, 6),
    ("Greater", [t(5), t()], {}, 5),
    ("GreaterOrEqual", [t(1, 1, 4, 4), t(2, 3, 1, 1)], {}, 96),
    ("Not", [t(3, 2, dtype=DType.BOOL)], {}, 6),
    ("DequantizeLinear", [u8(2, 3)], {"scale": 0.5}, 12),  # (x - zero) * scale
    ("Dropout", [t(4, 3)], {"ratio": 0.5, "training": 1}, 12),
    ("Dropout", [t(4, 3)], {"ratio": 0.5, "training": 0}, 0),
    ("DropoutGrad", [t(4, 3), t(4, 3, dtype=DType.BOOL)], {"ratio": 0.5}, 12),
    ("DropoutGrad", [t(4, 3), t(4, 3, dtype=DType.BOOL)], {"ratio": 0.0}, 0),
    # gradients of data movement that add
    ("PadGrad", [t(2, 6), t(2, 4)], {"pads": (0, 1, 0, 1), "mode": "reflect"}, 4),
    ("PadGrad", [t(2, 6), t(2, 4)], {"pads": (0, 1, 0, 1), "mode": "constant"}, 0),
    ("GatherGrad", [t(4, 3), i64(4), t(5, 3)], {"axis": 0}, 12),
    # pooling: 1 per window element read
    ("MaxPool", [t(1, 2, 4, 4)], {"kernel_shape": (2, 2), "strides": (2, 2)}, 32),
    ("MaxPool", [t(2, 1, 5)], {"kernel_shape": (3,)}, 18),  # 1-D: 2 x 3 windows of 3
    ("AveragePool", [t(1, 2, 4, 4)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}, 288),
    ("MaxPoolGrad", [t(1, 2, 4, 4), t(1, 2, 2, 2), t(1, 2, 2, 2)],
     {"kernel_shape": (2, 2), "strides": (2, 2)}, 32),
    ("AveragePoolGrad", [t(1, 2, 4, 4), t(1, 2, 2, 2)],
     {"kernel_shape": (2, 2), "strides": (2, 2)}, 32),
    # losses: 5 per score and 1 per target; gradients 2 and 1; weights 1 more per target
    ("SoftmaxCrossEntropyLoss", [t(4, 3), i64(4)], {}, 64),
    ("SoftmaxCrossEntropyLoss", [t(1, 10), i64(1)], {}, 51),
    ("SoftmaxCrossEntropyLoss", [t(4, 3), i64(4), t(3)], {}, 68),
    ("SoftmaxCrossEntropyLoss", [t(2, 3, 5), i64(2, 5)], {"reduction": "none"}, 160),
    ("SoftmaxCrossEntropyLossGrad", [t(), t(4, 3), i64(4)], {}, 28),
    ("SoftmaxCrossEntropyLossGrad", [t(), t(4, 3), i64(4), t(3)], {}, 32),
    ("NegativeLogLikelihoodLoss", [t(4, 3), i64(4)], {}, 4),
    ("NegativeLogLikelihoodLoss", [t(4, 3), i64(4), t(3)], {}, 8),
    ("NegativeLogLikelihoodLossGrad", [t(), t(4, 3), i64(4)], {}, 4),
    ("MSELoss", [t(4, 3), t(4, 3)], {}, 36),
    ("MSELoss", [t(1, 1), t(1, 1)], {}, 3),
    ("MSELossGrad", [t(), t(4, 3), t(4, 3)], {}, 24),
    ("MAELoss", [t(4, 3), t(4, 3)], {}, 36),
    ("MAELossGrad", [t(), t(4, 3), t(4, 3)], {}, 36),
    ("HuberLoss", [t(4, 3), t(4, 3)], {}, 72),
    ("HuberLossGrad", [t(), t(4, 3), t(4, 3)], {}, 36),
    ("RMSE", [t(4, 3), t(4, 3)], {}, 36),
    # metrics: the arg-max 1 per score, 1 per row per comparison or count
    ("Accuracy", [t(4, 3), i64(4)], {}, 20),
    ("Accuracy", [t(4, 2, 3), i64(4)], {}, 40),  # a stack of 2 models: 8 rows
    ("ClassCounts", [t(4, 3), i64(4)], {}, 24),
    ("PositiveScore", [t(4, 2)], {}, 8),
    ("RegressionSums", [t(4, 3), t(4, 3)], {}, 96),
    # normalisation: a fixed count per element of X
    ("BatchNormalization", [t(2, 3, 4, 4), t(3), t(3), t(3), t(3)], {"training_mode": 1}, 576),
    ("BatchNormalization", [t(2, 3, 4, 4), t(3), t(3), t(3), t(3)], {"training_mode": 0}, 192),
    ("BatchNormalizationGrad", [t(2, 3, 4, 4), t(2, 3, 4, 4), t(3), t(3), t(3)],
     {"training_mode": 1}, 1056),
    ("BatchNormalizationGrad", [t(1, 3, 2), t(1, 3, 2), t(3), t(3), t(3)],
     {"training_mode": 0}, 30),
    ("LayerNormalization", [t(2, 3, 4), t(4)], {}, 168),
    ("LayerNormalization", [t(2, 3, 4), t(4), t(4)], {}, 192),
    ("LayerNormalizationGrad", [t(2, 3, 4), t(2, 3, 4), t(4)], {}, 432),
    ("LRN", [t(1, 4, 2, 2)], {"size": 3}, 112),
    ("LRNGrad", [t(1, 4, 2, 2), t(1, 4, 2, 2)], {"size": 3}, 240),
    # a stack of 2 models: each model's work
    ("StackedGemm", [t(5, 3), t(2, 3, 4), t(2, 4)], {}, 280),  # 2*5*2*4*3 + 5*2*4
    ("StackedGemm", [t(1, 2, 3), t(2, 4, 3)], {"transB": 1}, 48),
    ("StackedGemm", [t(5, 3), t(3, 2, 4)], {"model_axis": 1}, 240),
    ("StackedGemmGradInput", [t(5, 2, 4), t(2, 3, 4)], {"shared": 1}, 240),
    ("StackedGemmGradInput", [t(5, 2, 4), t(2, 3, 4)], {"shared": 0}, 240),
    ("StackedGemmGradWeight", [t(5, 3), t(5, 2, 4)], {}, 240),
    ("StackedGemmGradWeight", [t(5, 2, 3), t(5, 2, 4)], {"transB": 1}, 240),
    ("StackedSoftmaxCrossEntropyLoss", [t(5, 2, 3), i64(5)], {}, 160),
    ("StackedSoftmaxCrossEntropyLossGrad", [t(2), t(5, 2, 3), i64(5)], {}, 70),
    # the dequantizing GEMM: DequantizeLinear's 2 per element of A, then Gemm's
    ("DequantizeGemm", [u8(4, 3), t(3, 5), t(5)], {"scale": 0.5}, 24 + 120 + 20),
    ("DequantizeGemm", [u8(4, 3), t(3, 5)], {"scale": 0.5, "activation": "Relu",
                                            "alpha": 2.0}, 24 + 120 + 20 + 20),
    ("DequantizeGemm", [u8(1, 3), t(5, 3), t(1, 5)], {"scale": 0.5, "transB": 1, "beta": 0.5},
     6 + 30 + 5 + 5),
    ("DequantizeGemmGradB", [u8(4, 3), t(4, 5)], {"scale": 0.5}, 120),
    ("DequantizeGemmGradB", [u8(4, 3), t(4, 5)], {"scale": 0.5, "alpha": 2.0}, 135),
]


@pytest.mark.parametrize(("name", "ins", "attrs", "expected"), HAND,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HAND)])
def test_hand_counts(name: str, ins: list[TensorDesc], attrs: dict[str, Any],
                     expected: int) -> None:
    assert flops(name, ins, **attrs) == expected


def test_every_op_has_a_direct_count_here() -> None:
    """An op added to the table needs a case in HAND or among the products."""
    products = {"MatMul", "MatMulT", "Gemm", "FusedGemm", "Conv", "ConvGradWeight",
                "ConvGradInput", "ConvTranspose", "ConvTransposeGrad"}
    missing = set(OP_TABLE) - {c[0] for c in HAND} - products
    assert not missing, f"no FLOP count checked for {sorted(missing)}"


# -- products: literal loops ---------------------------------------------------------------


def loop_gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, alpha: float, beta: float
              ) -> tuple[np.ndarray, int]:
    """alpha a @ b + beta c, an operation at a time, and how many it took."""
    m, k = a.shape
    n = b.shape[1]
    ops = 0
    y = np.zeros((m, n))
    for i, j in itertools.product(range(m), range(n)):
        s = 0.0
        for p in range(k):
            s += a[i, p] * b[p, j]
            ops += 2
        if alpha != 1.0:
            s *= alpha
            ops += 1
        y[i, j] = s
    if c is not None:
        cb = np.array(c, dtype=float)
        if beta != 1.0:
            for idx in np.ndindex(cb.shape):
                cb[idx] *= beta
                ops += 1
        cb = np.broadcast_to(cb, y.shape)
        for i, j in itertools.product(range(m), range(n)):
            y[i, j] += cb[i, j]
            ops += 1
    return y, ops


@pytest.mark.parametrize(("ta", "tb", "alpha", "beta", "bias"), [
    (0, 0, 1.0, 1.0, None), (1, 0, 1.0, 1.0, (5,)), (0, 1, 2.0, 0.5, (4, 5)),
    (1, 1, 1.0, 0.5, (1, 5)),
])
def test_gemm_counts_its_loop(ta: int, tb: int, alpha: float, beta: float,
                              bias: tuple[int, ...] | None) -> None:
    rng = np.random.default_rng(0)
    a = rng.random((3, 4) if ta else (4, 3))
    b = rng.random((5, 3) if tb else (3, 5))
    c = rng.random(bias) if bias else None
    y, ops = loop_gemm(a.T if ta else a, b.T if tb else b, c, alpha, beta)
    want = alpha * (a.T if ta else a) @ (b.T if tb else b) + (0 if c is None else beta * c)
    np.testing.assert_allclose(y, want)
    ins = [t(*a.shape), t(*b.shape), *([t(*bias)] if bias else [])]
    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    assert flops("Gemm", ins, **attrs) == ops
    # FusedGemm: the Gemm and its activation, 1 per output element
    assert flops("FusedGemm", ins, activation="Tanh", **attrs) == ops + 4 * 5


@pytest.mark.parametrize(("a", "b", "ta", "tb"), [
    ((4, 3), (3, 5), 0, 0), ((2, 1, 3, 4), (5, 4, 6), 0, 0), ((1, 4, 3), (3, 2), 0, 0),
    ((3,), (3, 5), 0, 0), ((2, 3, 4), (2, 5, 4), 0, 1), ((2, 4, 3), (4, 5), 1, 0),
])
def test_matmul_counts_its_loop(a: tuple[int, ...], b: tuple[int, ...], ta: int, tb: int
                                ) -> None:
    rng = np.random.default_rng(1)
    x, w = rng.random(a), rng.random(b)
    xt = np.swapaxes(x, -1, -2) if ta else x
    wt = np.swapaxes(w, -1, -2) if tb else w
    want = np.matmul(xt, wt)
    # each output element: a dot product of the broadcast operands, 2 per term
    x2 = xt.reshape(1, -1) if xt.ndim == 1 else xt
    lead = np.broadcast_shapes(x2.shape[:-2], wt.shape[:-2])
    xs = np.broadcast_to(x2, (*lead, *x2.shape[-2:]))
    ws = np.broadcast_to(wt, (*lead, *wt.shape[-2:]))
    ops = 0
    got = np.zeros((*lead, x2.shape[-2], wt.shape[-1]))
    for idx in np.ndindex(got.shape):
        *batch, i, j = idx
        for p in range(x2.shape[-1]):
            got[idx] += xs[(*batch, i, p)] * ws[(*batch, p, j)]
            ops += 2
    np.testing.assert_allclose(got.reshape(want.shape), want)
    name = "MatMulT" if ta or tb else "MatMul"
    extra = {"transA": ta, "transB": tb} if name == "MatMulT" else {}
    assert flops(name, [t(*a), t(*b)], **extra) == ops


def _pads(padding: tuple[int, int]) -> tuple[int, int, int, int]:
    return (padding[0], padding[1], padding[0], padding[1])


CONVS = [  # x, w, stride, padding, dilation, group, bias
    ((1, 2, 5, 5), (3, 2, 3, 3), (1, 1), (0, 0), (1, 1), 1, True),
    ((2, 4, 5, 4), (4, 2, 2, 3), (2, 1), (1, 1), (1, 2), 2, False),
    ((1, 3, 4, 4), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3, True),  # depthwise
]


def loop_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, int],
              padding: tuple[int, int], dilation: tuple[int, int], group: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """The convolution and its two gradients (for dY of ones), a term at a time, with
    how many operations each took (a tap that reads the padding counts: MFU counts the
    convolution's arithmetic)."""
    n, _, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + 2 * pw - (kw - 1) * dw - 1) // sw + 1
    mg = m // group
    y = np.zeros((n, m, oh, ow))
    dxp = np.zeros_like(xp)
    dwt = np.zeros_like(w)
    ops = {"y": 0, "dx": 0, "dw": 0}
    for ni, mi, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = mi // mg
        for ci, ki, kj in itertools.product(range(cg), range(kh), range(kw)):
            r, s, cc = i * sh + ki * dh, j * sw + kj * dw, g * cg + ci
            y[ni, mi, i, j] += xp[ni, cc, r, s] * w[mi, ci, ki, kj]
            dxp[ni, cc, r, s] += w[mi, ci, ki, kj] * 1.0
            dwt[mi, ci, ki, kj] += xp[ni, cc, r, s] * 1.0
            ops["y"] += 2
            ops["dx"] += 2
            ops["dw"] += 2
        if b is not None:
            y[ni, mi, i, j] += b[mi]
            ops["y"] += 1
    return y, dxp[:, :, ph:ph + h, pw:pw + wd], dwt, ops


@pytest.mark.parametrize("case", CONVS)
def test_conv_and_gradients_count_their_loop(case: tuple[Any, ...]) -> None:
    torch = pytest.importorskip("torch")
    xs, ws, stride, padding, dilation, group, bias = case
    rng = np.random.default_rng(2)
    x, w = rng.random(xs), rng.random(ws)
    b = rng.random(ws[0]) if bias else None
    y, dx, dw, ops = loop_conv(x, w, b, stride, padding, dilation, group)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, None if b is None else torch.tensor(b), stride,
                                    padding, dilation, group)
    ty.backward(torch.ones_like(ty))
    np.testing.assert_allclose(y, ty.detach().numpy())  # the loop is the convolution
    np.testing.assert_allclose(dx, tx.grad.numpy())
    np.testing.assert_allclose(dw, tw.grad.numpy())
    attrs = {"strides": stride, "pads": _pads(padding), "dilations": dilation, "group": group}
    ins = [t(*xs), t(*ws), *([t(ws[0])] if bias else [])]
    assert flops("Conv", ins, **attrs) == ops["y"]
    dy = t(*y.shape)
    assert flops("ConvGradWeight", [t(*xs), dy], w_shape=ws, **attrs) == ops["dw"]
    assert flops("ConvGradInput", [t(*ws), dy], x_shape=xs, **attrs) == ops["dx"]


def loop_conv_transpose(x: np.ndarray, w: np.ndarray, stride: int, pad: int, group: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """1-D ConvTranspose and its gradients (dY of ones): each input cell times each
    kernel tap lands on the output, a multiply-add per output channel of its group."""
    n, c, length = x.shape
    _, mg, k = w.shape
    cg = c // group
    full = stride * (length - 1) + k
    y = np.zeros((n, mg * group, full))
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    ops = {"y": 0, "grad": 0}
    for ni, ci, i, kk, mo in itertools.product(range(n), range(c), range(length), range(k),
                                               range(mg)):
        m = (ci // cg) * mg + mo
        pos = stride * i + kk
        y[ni, m, pos] += x[ni, ci, i] * w[ci, mo, kk]
        ops["y"] += 2
        inside = pad <= pos < full - pad  # dY is 1 where the crop keeps the output
        dx[ni, ci, i] += w[ci, mo, kk] * float(inside)
        dw[ci, mo, kk] += x[ni, ci, i] * float(inside)
        ops["grad"] += 4
    return y[:, :, pad:full - pad], dx, dw, ops


@pytest.mark.parametrize(("xs", "ws", "stride", "pad", "group"), [
    ((1, 2, 3), (2, 3, 2), 2, 0, 1), ((2, 4, 3), (4, 1, 3), 1, 1, 2),
])
def test_conv_transpose_counts_its_loop(xs: tuple[int, ...], ws: tuple[int, ...], stride: int,
                                        pad: int, group: int) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w = rng.random(xs), rng.random(ws)
    y, dx, dw, ops = loop_conv_transpose(x, w, stride, pad, group)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv_transpose1d(tx, tw, stride=stride, padding=pad, groups=group)
    ty.backward(torch.ones_like(ty))
    np.testing.assert_allclose(y, ty.detach().numpy())
    np.testing.assert_allclose(dx, tx.grad.numpy())
    np.testing.assert_allclose(dw, tw.grad.numpy())
    attrs = {"strides": (stride,), "pads": (pad, pad), "group": group}
    assert flops("ConvTranspose", [t(*xs), t(*ws)], **attrs) == ops["y"]
    assert flops("ConvTranspose", [t(*xs), t(*ws), t(ws[1] * group)], **attrs) == \
        ops["y"] + y.size  # the bias, 1 per output element
    assert flops("ConvTransposeGrad", [t(*xs), t(*ws), t(*y.shape)], **attrs) == ops["grad"]


# -- products: PyTorch's FLOP counter ---------------------------------------------------------


def torch_flops(fn: Any) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


@pytest.mark.parametrize(("a", "b"), [((64, 784), (784, 64)), ((1, 10), (10, 3)),
                                      ((2, 1, 3, 4), (5, 4, 6)), ((7, 3, 8), (8, 2))])
def test_matmul_agrees_with_torch(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    x, w = torch.zeros(a), torch.zeros(b)
    assert flops("MatMul", [t(*a), t(*b)]) == torch_flops(lambda: torch.matmul(x, w))
    xt = x.transpose(-1, -2).contiguous()  # MatMulT reads it transposed
    assert flops("MatMulT", [t(*xt.shape), t(*b)], transA=1) == \
        torch_flops(lambda: torch.matmul(xt.transpose(-1, -2), w))


@pytest.mark.parametrize(("m", "k", "n"), [(64, 784, 64), (1, 64, 10), (32, 5, 7)])
def test_gemm_and_its_gradients_agree_with_torch(m: int, k: int, n: int) -> None:
    torch = pytest.importorskip("torch")
    a = torch.zeros(m, k, requires_grad=True)
    w = torch.zeros(k, n, requires_grad=True)
    c = torch.zeros(n)
    fwd = torch_flops(lambda: torch.addmm(c, a, w))  # torch counts the product only
    assert flops("Gemm", [t(m, k), t(k, n)]) == fwd
    assert flops("Gemm", [t(m, k), t(k, n), t(n)]) == fwd + m * n  # the bias, 1 each
    y = a @ w
    dy = torch.ones(m, n)
    da = torch_flops(lambda: torch.autograd.grad(y, [a], dy, retain_graph=True))
    dw = torch_flops(lambda: torch.autograd.grad(y, [w], dy, retain_graph=True))
    # the engine's gradient products (linalg._g_gemm): dA = dY W^T, dW = A^T dY
    assert flops("Gemm", [t(m, n), t(k, n)], transB=1) == da
    assert flops("Gemm", [t(m, k), t(m, n)], transA=1) == dw


@pytest.mark.parametrize("case", [c for c in CONVS if c[5] == 1] + [
    ((2, 4, 7, 6), (6, 4, 3, 3), (2, 1), (1, 1), (1, 2), 1, True),
    ((1, 3, 8, 8), (8, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1, False),
])
def test_conv_and_gradients_agree_with_torch(case: tuple[Any, ...]) -> None:
    """Ungrouped: torch's counter counts a grouped weight gradient group times over."""
    torch = pytest.importorskip("torch")
    xs, ws, stride, padding, dilation, group, bias = case
    x = torch.zeros(xs, requires_grad=True)
    w = torch.zeros(ws, requires_grad=True)
    fwd = torch_flops(lambda: torch.nn.functional.conv2d(x, w, None, stride, padding,
                                                         dilation, group))
    y = torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, group)
    dy = torch.ones_like(y)
    dx = torch_flops(lambda: torch.autograd.grad(y, [x], dy, retain_graph=True))
    dw = torch_flops(lambda: torch.autograd.grad(y, [w], dy, retain_graph=True))
    attrs = {"strides": stride, "pads": _pads(padding), "dilations": dilation, "group": group}
    bias_in = [t(ws[0])] if bias else []
    assert flops("Conv", [t(*xs), t(*ws), *bias_in], **attrs) == fwd + (y.numel() if bias else 0)
    assert flops("ConvGradInput", [t(*ws), t(*y.shape)], x_shape=xs, **attrs) == dx
    assert flops("ConvGradWeight", [t(*xs), t(*y.shape)], w_shape=ws, **attrs) == dw


@pytest.mark.parametrize(("xs", "ws", "stride", "pad", "dilation"), [
    ((2, 4, 3, 5), (4, 3, 2, 3), (2, 2), (1, 1), (1, 2)),
    ((1, 2, 4), (2, 5, 3), (1,), (0,), (1,)),
    ((1, 2, 2, 2, 2), (2, 1, 2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)),
])
def test_conv_transpose_and_gradient_agree_with_torch(xs: tuple[int, ...], ws: tuple[int, ...],
                                                      stride: tuple[int, ...],
                                                      pad: tuple[int, ...],
                                                      dilation: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    fn = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d,
          5: torch.nn.functional.conv_transpose3d}[len(xs)]
    x = torch.zeros(xs, requires_grad=True)
    w = torch.zeros(ws, requires_grad=True)
    fwd = torch_flops(lambda: fn(x, w, stride=stride, padding=pad, dilation=dilation))
    y = fn(x, w, stride=stride, padding=pad, dilation=dilation)
    grad = torch_flops(lambda: torch.autograd.grad(y, [x, w], torch.ones_like(y)))
    attrs = {"strides": stride, "pads": pad + pad, "dilations": dilation}
    assert flops("ConvTranspose", [t(*xs), t(*ws)], **attrs) == fwd
    assert flops("ConvTransposeGrad", [t(*xs), t(*ws), t(*y.shape)], **attrs) == grad
