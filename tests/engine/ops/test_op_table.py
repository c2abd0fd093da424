"""The op table is complete: every op has every rule."""

from __future__ import annotations

import pytest

from engine.ops import OP_TABLE, DoesNotStack, NonDifferentiable, OpDef, StackRule
from engine.ops._base import NO_INPUTS, no_workspace
from engine.ops._onnx import EngineInternal, OnnxForm


@pytest.mark.parametrize("name", sorted(OP_TABLE))
def test_op_has_every_rule(name: str) -> None:
    op: OpDef = OP_TABLE[name]
    assert op.name == name
    assert callable(op.shape), "shape rule"
    assert callable(op.kernel), "forward kernel"
    assert callable(op.workspace), "workspace rule"
    assert callable(op.flops), "FLOP rule"
    assert isinstance(op.grad, NonDifferentiable) or callable(op.grad), "gradient rule"
    if isinstance(op.grad, NonDifferentiable):
        assert op.grad.reason, "a non-differentiable op says why"
    assert isinstance(op.inplace, tuple)
    assert all(0 <= i < op.num_inputs[1] for i in op.inplace), "in-place policy names inputs"
    lo, hi = op.num_inputs
    assert (0 if op.grad == NO_INPUTS else 1) <= lo <= hi and op.num_outputs >= 1
    assert op.doc, "every op documents its semantics"
    assert isinstance(op.stacking, StackRule | DoesNotStack), \
        "a stacking rule, or DoesNotStack with the reason"
    if isinstance(op.stacking, DoesNotStack):
        assert op.stacking.reason
    assert isinstance(op.onnx, OnnxForm | EngineInternal), \
        "an ONNX form, or EngineInternal with the reason"
    if isinstance(op.onnx, EngineInternal):
        assert op.onnx.reason
    else:
        assert op.onnx.exports or op.onnx.imports, "an ONNX form is written or read"
    for vname, v in op.variants.items():
        assert callable(v.applies) and callable(v.kernel), f"variant {vname}"
        assert callable(v.workspace), f"variant {vname}: workspace rule"
        assert v.doc, f"variant {vname} documents itself"


def test_onnx_forms_name_onnx_operators() -> None:
    """Each ONNX operator is read into one op, and is one ONNX knows."""
    from onnx import defs

    read = [op.onnx.name for op in OP_TABLE.values()
            if isinstance(op.onnx, OnnxForm) and op.onnx.imports]
    assert len(read) == len(set(read)), "two ops read the same ONNX operator"
    for op in OP_TABLE.values():
        if isinstance(op.onnx, OnnxForm):
            assert defs.has(op.onnx.name), f"{op.name}: ONNX has no {op.onnx.name}"


def test_op_table_imports_no_onnx() -> None:
    """The ONNX forms receive onnx's modules: the op table never imports them."""
    import subprocess
    import sys

    code = "import sys, engine.ops; print('onnx' in sys.modules or 'engine.onnx_io' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_required_instruction_set_is_present() -> None:
    required = {
        "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Sqrt",
        "Square", "Sin", "Cos", "Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Softmax",
        "LogSoftmax", "ReduceSum", "ReduceMean", "Reshape", "Flatten", "Dropout",
        "SoftmaxCrossEntropyLoss", "MSELoss", "Accuracy", "RMSE", "MAELoss", "HuberLoss",
        "RegressionSums", "ClassCounts", "PositiveScore",
    }
    assert required <= set(OP_TABLE)


def test_ops_needing_scratch_declare_it() -> None:
    # Ops whose kernels carve scratch from the workspace must size it.
    for name in ("Elu", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "Accuracy",
                 "RMSE", "MSELoss", "Dropout", "LeakyReluGrad", "EluGrad", "MAELoss",
                 "HuberLoss", "RegressionSums", "ClassCounts"):
        assert OP_TABLE[name].workspace is not no_workspace, name
