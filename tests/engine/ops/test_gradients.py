"""Every op's gradient against central finite differences, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import OP_TABLE, NonDifferentiable
from engine.ops._base import INTEGER_INPUT, NO_INPUTS, SHAPE_ONLY
from engine.ops.compare import no_gradient
from tests.gradcheck import Case, check, ops_in

R = np.random.default_rng(42)


def f(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return R.uniform(low, high, size=shape)


def away_from_zero(*shape: int) -> np.ndarray:
    x = f(*shape)
    return np.where(np.abs(x) < 0.2, 0.5, x)


labels = np.array([0, 2, 1, 4], dtype=np.int64)
_R2 = np.random.default_rng(43)
_P = _R2.uniform(-2.0, 2.0, size=(3, 4))


def _away(*shape: int) -> np.ndarray:
    """Differences in +-[0.2, 1.5]: no kink of |d| within reach of a finite difference."""
    return _R2.choice([-1.0, 1.0], size=shape) * _R2.uniform(0.2, 1.5, size=shape)


def q(*shape: int, dtype: str = "uint8", low: int = 0, high: int = 16) -> np.ndarray:
    """Integer data in [low, high): small enough that a Sigmoid after it is not flat."""
    return R.integers(low, high, size=shape).astype(dtype)

CASES = [
    Case("Neg", [f(3, 4)]),
    Case("Abs", [away_from_zero(3, 4)]),
    Case("Exp", [f(3, 4)]),
    Case("Log", [f(3, 4, low=0.5, high=3.0)]),
    Case("Sqrt", [f(3, 4, low=0.5, high=3.0)]),
    Case("Square", [f(3, 4)]),
    Case("Sin", [f(3, 4)]),
    Case("Cos", [f(3, 4)]),
    Case("Sign", [away_from_zero(3, 4)]),
    Case("Identity", [f(3, 4)]),
    Case("Tanh", [f(3, 4)]),
    Case("Relu", [away_from_zero(3, 4)]),
    Case("Sigmoid", [f(3, 4)]),
    Case("LeakyRelu", [away_from_zero(3, 4)], {"alpha": 0.1}),
    Case("LeakyRelu", [away_from_zero(3, 4)], {"alpha": 2.0}),
    Case("Elu", [away_from_zero(3, 4)], {"alpha": 0.7}),
    Case("Add", [f(3, 4), f(3, 4)]),
    Case("Add", [f(3, 4), f(4)]),
    Case("Add", [f(2, 3, 4), f(3, 1)]),
    Case("Sub", [f(3, 4), f(1, 4)]),
    Case("Mul", [f(3, 4), f(3, 1)]),
    Case("Mul", [f(3, 4), f()]),
    Case("Div", [f(3, 4), f(4, low=0.5, high=2.0)]),
    Case("SumTo", [f(2, 3, 4)], {"axes": (0, 2), "shape": (3, 1)}),
    Case("Expand", [f(3, 1), f(3, 4)], diff=(0,)),
    Case("MatMul", [f(3, 4), f(4, 5)]),
    Case("MatMul", [f(2, 3, 4), f(4, 5)]),
    Case("MatMul", [f(2, 3, 4), f(2, 4, 5)]),
    Case("MatMulT", [f(4, 3), f(5, 4)], {"transA": 1, "transB": 1}),
    Case("MatMulT", [f(2, 4, 3), f(4, 5)], {"transA": 1}),
    Case("Gemm", [f(3, 4), f(4, 5), f(5)]),
    Case("Gemm", [f(4, 3), f(4, 5), f(3, 5)], {"transA": 1, "alpha": 0.5, "beta": 2.0}),
    Case("Gemm", [f(3, 4), f(5, 4), f(1, 5)], {"transB": 1}),
    Case("Gemm", [f(4, 3), f(5, 4)], {"transA": 1, "transB": 1, "alpha": 1.5}),
    Case("ReduceSum", [f(3, 4, 2)], {"axes": (1,)}),
    Case("ReduceSum", [f(3, 4, 2)], {"axes": (0, 2), "keepdims": 0}),
    Case("ReduceMean", [f(3, 4, 2)], {"axes": (-1,), "keepdims": 0}),
    Case("ReduceMean", [f(3, 4)]),
    Case("ReduceGrad", [f(3), f(3, 4)], {"axes": (1,), "keepdims": 0, "mean": 1}, diff=(0,)),
    Case("Softmax", [f(3, 5)]),
    Case("Softmax", [f(2, 3, 4)], {"axis": 1}),
    Case("LogSoftmax", [f(3, 5)]),
    Case("LogSoftmax", [f(4, 3, 2)], {"axis": 0}),
    Case("Reshape", [f(3, 4)], {"shape": (2, -1)}),
    Case("Flatten", [f(2, 3, 4)], {"axis": 2}),
    Case("Conv", [f(2, 3, 5, 5), f(4, 3, 3, 3), f(4)]),
    Case("Conv", [f(2, 4, 6, 5), f(6, 2, 3, 2)], {"group": 2, "strides": (2, 1),
                                                  "pads": (1, 0, 1, 1)}),
    Case("Conv", [f(1, 2, 7, 7), f(3, 2, 3, 3)], {"dilations": (2, 2),
                                                  "auto_pad": "SAME_UPPER"}),
    Case("MaxPool", [f(2, 3, 6, 5)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    Case("MaxPool", [f(1, 2, 5, 5)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
    Case("AveragePool", [f(2, 2, 6, 6)], {"kernel_shape": (3, 3), "strides": (2, 2)}),
    Case("AveragePool", [f(1, 2, 5, 4)], {"kernel_shape": (2, 3), "pads": (1, 1, 0, 1)}),
    Case("AveragePool", [f(1, 2, 5, 4)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1),
                                          "count_include_pad": 1}),
    Case("GlobalAveragePool", [f(2, 3, 4, 5)]),
    Case("Floor", [f(3, 4)]),
    Case("Where", [R.random((3, 4)) > 0.5, f(3, 4), f(4)], diff=(1, 2)),
    Case("Ceil", [f(3, 4)]),
    Case("Reciprocal", [away_from_zero(3, 4)]),
    Case("Softplus", [f(3, 4)]),
    Case("Gelu", [f(3, 4, low=-3.0, high=3.0)]),
    Case("Gelu", [f(3, 4, low=-3.0, high=3.0)], {"approximate": "tanh"}),
    Case("Erf", [f(3, 4, low=-2.5, high=2.5)]),
    Case("Erf", [f(2, 3, low=-0.4, high=0.4)]),  # within the series' reach
    Case("HardSwish", [np.array([[-4.0, -2.9, -1.1, 0.3], [1.7, 2.6, 3.5, -0.2]])]),
    Case("Mish", [f(3, 4, low=-4.0, high=4.0)]),
    Case("InstanceNormalization", [f(2, 3, 4, 5), f(3), f(3)]),
    Case("InstanceNormalization", [f(3, 2, 6), f(2), f(2)], {"epsilon": 0.1}),
    Case("Resize", [f(2, 3, 2, 3)], {"factors": (1, 1, 2, 3)}),
    Case("Resize", [f(2, 4)], {"factors": (3, 1)}),  # no batch here: any axis
    Case("Selu", [away_from_zero(3, 4)]),
    Case("Celu", [away_from_zero(3, 4)], {"alpha": 0.7}),
    Case("Celu", [away_from_zero(3, 4)], {"alpha": -0.7}),  # x / alpha flips its sign
    Case("PRelu", [away_from_zero(2, 3, 4), f(3, 1)]),  # a slope per channel
    Case("PRelu", [away_from_zero(3, 4), f(1)]),
    Case("Softsign", [away_from_zero(3, 4)]),
    Case("HardSigmoid", [f(3, 4, low=-1.2, high=1.9)], {"alpha": 0.3, "beta": 0.4}),
    Case("Max", [f(3, 4), f(4)]),
    Case("Min", [f(3, 4), f(3, 1)]),
    Case("Max", [f(2, 3)]),
    Case("Clip", [np.array([[-1.5, -0.3, 0.4, 1.7], [0.1, -0.9, 2.5, -2.2]])],
         {"min": -1.0, "max": 1.0}),
    Case("Clip", [np.array([[-1.5, -0.3, 0.4, 1.7]])], {"min": 0.0}),
    Case("Squeeze", [f(3, 1, 4, 1)], {"axes": (1, 3)}),
    Case("Concat", [f(2, 3), f(2, 1), f(2, 2)], {"axis": 1}),
    Case("Split", [f(3, 5)], {"axis": 1, "split": (2, 3)}, outputs=(0, 1)),
    Case("Split", [f(4, 3)], {"axis": 0, "num_outputs": 2}, outputs=(1,)),
    Case("Unsqueeze", [f(3, 4)], {"axes": (0, 2)}),
    Case("Transpose", [f(2, 3, 4)], {"perm": (2, 0, 1)}),
    Case("Transpose", [f(3, 4)]),
    Case("FusedGemm", [f(3, 4), f(4, 5), f(5)], {"activation": "Relu"}),
    Case("FusedGemm", [f(4, 3), f(4, 5)], {"activation": "Sigmoid", "transA": 1, "alpha": 0.5}),
    Case("FusedGemm", [f(3, 4), f(5, 4), f(3, 5)], {"activation": "Tanh", "transB": 1,
                                                    "beta": 2.0}),
    # Integer rows in blocks: several blocks (block_rows=2 over 5 rows), one block.
    Case("DequantizeGemm", [q(5, 4), f(4, 3), f(3)], {"scale": 0.25, "zero_point": 3,
                                                      "activation": "Sigmoid", "block_rows": 2}),
    Case("DequantizeGemm", [q(4, 3, dtype="int8", low=-20, high=20), f(5, 3), f(4, 5)],
         {"scale": 0.1, "transB": 1, "beta": 2.0, "alpha": 0.5}),
    Case("DequantizeGemm", [q(6, 3), f(3, 2)], {"scale": 1 / 64, "activation": "Tanh",
                                                "transB": 0, "block_rows": 4}),
    Case("SoftmaxCrossEntropyLoss", [f(4, 5), labels]),
    Case("SoftmaxCrossEntropyLoss", [f(4, 5), labels], {"reduction": "sum"}, outputs=(0, 1)),
    Case("MSELoss", [f(3, 4), f(3, 4)]),
    # Stacks of 2 models: shared input (one GEMM with transB, a loop without), stacked input.
    Case("StackedGemm", [f(3, 4), f(2, 5, 4), f(2, 5)], {"transB": 1}),
    Case("StackedGemm", [f(3, 4), f(2, 4, 5)]),
    Case("StackedGemm", [f(3, 2, 4), f(2, 4, 5), f(2, 5)]),
    Case("StackedSoftmaxCrossEntropyLoss", [f(4, 2, 5), labels]),
    Case("StackedSoftmaxCrossEntropyLoss", [f(4, 3, 5), labels], {"reduction": "sum"}),
    Case("Dropout", [f(5, 6)], {"ratio": 0.3, "training": 1}),
    Case("Dropout", [f(5, 6)], {"ratio": 0.3, "training": 0}),
    Case("Cast", [f(3, 4)], {"to": "float64"}),
    # Batch statistics (the running ones are placeholders here), and the running ones.
    Case("BatchNormalization", [f(4, 3, 2, 2), f(3), f(3), f(3), f(3, low=0.5, high=2.0)],
         {"training_mode": 1}, diff=(0, 1, 2)),
    Case("BatchNormalization", [f(5, 2), f(2), f(2), f(2), f(2, low=0.5, high=2.0)],
         {"training_mode": 1, "epsilon": 0.1}, diff=(0, 1, 2)),
    Case("BatchNormalization", [f(4, 3, 2), f(3), f(3), f(3), f(3, low=0.5, high=2.0)],
         {"training_mode": 0}, diff=(0, 1, 2)),
    Case("LayerNormalization", [f(3, 4, 5), f(5), f(5)]),
    Case("LayerNormalization", [f(3, 4, 5), f(4, 5)], {"axis": 1, "epsilon": 0.1}),
    Case("Sum", [f(3, 4), f(4), f(3, 1)]),
    Case("ConvTranspose", [f(2, 4, 3, 3), f(4, 3, 2, 3), f(6)],
         {"strides": (2, 1), "pads": (1, 0, 0, 1), "group": 2}),
    Case("ConvTranspose", [f(1, 2, 4), f(2, 3, 3)], {"strides": (3,), "dilations": (2,),
                                                     "output_padding": (2,)}),
    Case("ConvTranspose", [f(1, 2, 2, 3, 2), f(2, 1, 2, 2, 2)], {"strides": (1, 2, 1)}),
    Case("Hardmax", [f(3, 4, 5)], {"axis": 1}),  # zero gradient: a forward check
    # the general losses: N-D scores, class weights, ignore_index, every reduction
    Case("NegativeLogLikelihoodLoss", [f(4, 5), labels]),
    Case("NegativeLogLikelihoodLoss", [f(3, 5, 2), labels[:3, None].repeat(2, 1),
                                       f(5, low=0.5, high=2.0)],
         {"reduction": "mean", "ignore_index": 2}, diff=(0,)),
    Case("NegativeLogLikelihoodLoss", [f(4, 5, 2), labels[:, None].repeat(2, 1)],
         {"reduction": "none"}),
    Case("SoftmaxCrossEntropyLoss", [f(3, 5, 2), labels[:3, None].repeat(2, 1),
                                     f(5, low=0.5, high=2.0)],
         {"reduction": "mean", "ignore_index": 0}, diff=(0,)),
    Case("SoftmaxCrossEntropyLoss", [f(4, 5), labels], {"reduction": "none"}),
    Case("SoftmaxCrossEntropyLoss", [f(4, 5, 3), labels[:, None].repeat(3, 1)],
         {"reduction": "sum", "ignore_index": 4}),
    # pooling over 1 and 3 spatial axes, ceil mode, dilations, pads counted or not
    Case("MaxPool", [f(2, 2, 7)], {"kernel_shape": (3,), "strides": (2,), "ceil_mode": 1}),
    Case("MaxPool", [f(1, 2, 4, 5, 3)], {"kernel_shape": (2, 2, 2), "dilations": (2, 1, 1),
                                         "pads": (0, 1, 1, 0, 1, 0)}),
    Case("AveragePool", [f(2, 2, 6)], {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1),
                                       "ceil_mode": 1}),
    Case("AveragePool", [f(1, 2, 4, 4, 3)], {"kernel_shape": (2, 3, 2), "pads": (1, 1, 0, 0, 1, 1),
                                             "count_include_pad": 1}),
    Case("Slice", [f(4, 6, 3)], {"starts": (1, 5), "ends": (3, 0), "axes": (0, 1),
                                 "steps": (1, -2)}),
    Case("Pad", [f(3, 4)], {"pads": (1, 2, 0, 1), "value": 0.5}),
    Case("Pad", [f(3, 4)], {"pads": (2, 1, 1, 2), "mode": "edge"}),
    Case("Pad", [f(3, 4)], {"pads": (2, 1, 1, 3), "mode": "reflect"}),
    Case("Pad", [f(3, 4)], {"pads": (1, 3, 2, 1), "mode": "wrap"}),
    Case("Pad", [f(4, 5)], {"pads": (-1, 1, 0, -2), "mode": "edge"}),  # negative pads crop
    Case("Gather", [f(5, 3), np.array([[4, 0], [4, -1]], dtype=np.int64)], {"axis": 0}),
    Case("Gather", [f(2, 5, 3), np.array([1, 1, 3], dtype=np.int64)], {"axis": 1}),
    Case("Pow", [f(3, 4, low=0.5, high=2.0), f(4, low=-1.5, high=2.5)]),
    Case("Pow", [f(3, 4), np.array([2, 3, 1, 0], dtype=np.int64)]),
    Case("ReduceMax", [f(3, 4, 2)], {"axes": (1,)}),
    Case("ReduceMin", [f(3, 4, 2)], {"axes": (0, 2), "keepdims": 0}),
    Case("ReduceProd", [away_from_zero(3, 4)], {"axes": (1,)}),
    Case("ReduceL1", [away_from_zero(3, 4)]),
    Case("ReduceL2", [f(3, 4, 2)], {"axes": (2,), "keepdims": 0}),
    Case("ReduceLogSum", [f(3, 4, low=0.5, high=2.0)], {"axes": (1,)}),
    Case("ReduceLogSumExp", [f(3, 4, 2)], {"axes": (0, 1)}),
    Case("ReduceSumSquare", [f(3, 4)], {"axes": (0,)}),
    Case("LRN", [f(2, 5, 3, 2)], {"size": 3, "alpha": 0.5, "bias": 1.5}),
    Case("LRN", [f(2, 6, 3)], {"size": 4, "alpha": 0.3, "beta": 0.6}),  # an even window
    # MAE away from its kink at p == t; Huber on both sides of delta (its gradient has
    # no kink).  Their own generator: the draws above stay as they were.
    Case("MAELoss", [_P, _P + _away(3, 4)]),
    Case("HuberLoss", [_P, _P + _away(3, 4) * 1.5], {"delta": 0.7}),
    Case("HuberLoss", [f(5), f(5)]),
]


# The fused kernels' forms (engine.ops.jit) of a Linear layer with a bias and a sigmoid:
# drawn last, so that the cases above keep their data.
CASES.append(Case("FusedGemm", [f(3, 4), f(4, 5), f(5)], {"activation": "Sigmoid"}))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradient_matches_finite_differences(case: Case, kernel_path: str) -> None:
    check(case)


METRICS = {name for name, op in OP_TABLE.items()
           if isinstance(op.grad, NonDifferentiable) and "metric" in op.grad.reason}
INTEGER_INPUTS = {name for name, op in OP_TABLE.items() if op.grad in (INTEGER_INPUT, NO_INPUTS,
                                                                      SHAPE_ONLY)}
# comparisons: a bool output, no gradient by definition (values: test_compare.py)
BOOLEAN = {name for name, op in OP_TABLE.items() if op.grad is no_gradient}


def test_every_op_is_gradient_checked() -> None:
    """Each op of the table runs in at least one checked program, forward or backward;
    metrics and comparisons (no gradient by definition) are checked for values in
    test_ops_forward and test_compare."""
    covered: set[str] = set()
    for case in CASES:
        covered |= ops_in(case)
    missing = set(OP_TABLE) - covered - METRICS - INTEGER_INPUTS - BOOLEAN
    assert not missing, f"ops without a gradient check: {sorted(missing)}"
