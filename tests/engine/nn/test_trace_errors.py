"""The common mistakes in a traced forward are TraceErrors that name the user's file and
line (the innermost frame outside engine/nn), quote it, and say what went wrong."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine import EngineError, nn
from engine.nn import TraceError

F = nn.functional


def line_of(fn: Callable[..., Any], text: str) -> int:
    """The line number of the first line of ``fn``'s source containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return first + i
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def traced(forward: Callable[..., Any], shape: tuple[int, ...] = (0, 4), **kw: Any) -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            return forward(self, x)

    nn.to_graph(M(), inputs={"x": shape}, **kw)


def expect(forward: Callable[..., Any], marker: str, *words: str, **kw: Any) -> TraceError:
    with pytest.raises(TraceError) as info:
        traced(forward, **kw)
    err = info.value
    assert isinstance(err, EngineError)
    assert err.filename == __file__ and err.lineno == line_of(forward, marker), str(err)
    text = str(err)
    assert text.startswith(f"{__file__}:{err.lineno}: ")
    assert marker in text  # the line is quoted
    for w in words:
        assert w in text, text
    return err


def test_if_on_a_traced_value() -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.fc(x)
        if h.sum() > 0:  # MARK-if
            h = -h
        return h

    expect(forward, "MARK-if", "bool() of a traced tensor", "control flow")


def test_equality_of_traced_values() -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.fc(x)
        return h if h == 0 else -h  # MARK-eq

    expect(forward, "MARK-eq", "bool() of a traced tensor", "control flow")


def test_bool_of_a_traced_value() -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.fc(x)
        while h:  # MARK-while
            h = h * 0.5
        return h

    expect(forward, "MARK-while", "bool() of a traced tensor", "control flow")


def test_and_or_on_traced_values() -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.fc(x) or x  # MARK-or

    expect(forward, "MARK-or", "bool()")


@pytest.mark.parametrize("call", ["exp", "asarray", "mean", "add-where"])
def test_numpy_on_a_traced_tensor(call: str) -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.fc(x)
        if call == "exp":
            return np.exp(h)  # MARK-exp
        if call == "asarray":
            return self.fc(np.asarray(x))  # MARK-asarray
        if call == "mean":
            return np.mean(h, axis=1)  # MARK-mean
        return np.add(h, 1.0, where=True)  # MARK-add-where

    err = expect(forward, f"MARK-{call}", "numpy")
    assert "engine.nn.functional" in str(err)


def test_numpy_scalars_and_arrays_are_constants() -> None:
    """Plain arithmetic with numpy operands on either side is not an error."""

    def forward(self: Any, x: Any) -> Any:
        return np.float32(2.0) * self.fc(x) + np.arange(3, dtype=np.float32)

    traced(forward)


@pytest.mark.parametrize("what", ["item", "float", "int", "index", "tolist"])
def test_reading_a_value(what: str) -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.fc(x)
        if what == "item":
            return h * h.sum().item()  # MARK-item
        if what == "float":
            return h * float(h.mean())  # MARK-float
        if what == "int":
            return h * int(h.mean())  # MARK-int
        if what == "index":
            return h * [1.0, 2.0][h.sum()]  # MARK-index
        return h * h.sum().tolist()  # MARK-tolist

    expect(forward, f"MARK-{what}", "not known while tracing")


def test_shape_mismatch_names_the_op_and_shapes() -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.fc(x) + x  # MARK-shape

    expect(forward, "MARK-shape", "Add(", "float32[b,3]", "float32[b,4]", "broadcast")


def test_shape_mismatch_inside_a_layer_points_at_the_call() -> None:
    """The failing Gemm is inside nn.Linear; the line is the user's call, and the
    message names the module."""

    def forward(self: Any, x: Any) -> Any:
        return self.fc(x.reshape(-1, 2, 2).flatten(1)[:, :2])  # MARK-layer

    expect(forward, "MARK-layer", "Gemm(", "float32[b,2]", "float32[3,4]", "fc (Linear)")


def test_a_layer_in_a_nested_module_points_at_the_innermost_user_line() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: Any) -> Any:
            return self.conv(x)  # MARK-inner

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(Block())

        def forward(self, x: Any) -> Any:
            return self.blocks(x.reshape(-1, 2, 4, 4))

    with pytest.raises(TraceError) as info:
        nn.to_graph(Net(), inputs={"x": (0, 32)})
    assert info.value.lineno == line_of(Block.forward, "MARK-inner")
    assert "blocks.0.conv (Conv2d)" in str(info.value) and "Conv(" in str(info.value)


def test_reshape_that_fixes_the_batch() -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.fc(x.reshape(8, 4))  # MARK-reshape

    expect(forward, "MARK-reshape", "symbolic batch")


def test_arithmetic_on_the_batch_size() -> None:
    def forward(self: Any, x: Any) -> Any:
        n = x.shape[0] * 2  # MARK-batch
        return self.fc(x) * n

    expect(forward, "MARK-batch", "batch size is symbolic")


def test_indexing_the_batch() -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.fc(x[0:2])  # MARK-slice

    expect(forward, "MARK-slice", "batch axis")


def test_unsupported_argument() -> None:
    def forward(self: Any, x: Any) -> Any:
        return F.gelu(self.fc(x), approximate="erf")  # MARK-arg

    expect(forward, "MARK-arg", "approximate")


def test_unsupported_operand() -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.fc(x) + "one"  # MARK-operand

    expect(forward, "MARK-operand", "unsupported operand of type str")


def test_forward_must_return_a_tensor() -> None:
    def forward(self: Any, x: Any) -> Any:
        return (self.fc(x), x)

    with pytest.raises(TraceError, match="must return one tensor"):
        traced(forward)


def test_a_tensor_kept_from_the_training_path() -> None:
    def forward(self: Any, x: Any) -> Any:
        if not hasattr(self, "kept"):
            object.__setattr__(self, "kept", self.fc(x))
        return self.kept * 2.0  # MARK-kept

    expect(forward, "MARK-kept", "keep no traced tensor")


def test_a_parameter_made_in_forward() -> None:
    def forward(self: Any, x: Any) -> Any:
        w = nn.Parameter(np.ones((4, 3), np.float32))
        return x @ w  # MARK-param

    expect(forward, "MARK-param", "does not own")


def test_bad_to_graph_arguments_point_at_the_call() -> None:
    with pytest.raises(TraceError) as info:
        nn.to_graph(nn.Linear(4, 3), inputs={"x": (0, 4)}, loss="hinge")  # MARK-loss
    assert info.value.lineno == line_of(test_bad_to_graph_arguments_point_at_the_call,
                                        "MARK-loss")
    assert "unknown loss 'hinge'" in str(info.value)
    with pytest.raises(TraceError, match="unknown metric 'f1'"):
        nn.to_graph(nn.Linear(4, 3), inputs={"x": (0, 4)}, metrics=["f1"])
    with pytest.raises(TraceError, match="needs class scores"):
        nn.to_graph(nn.Linear(4, 1), inputs={"x": (0, 4)}, loss="mse", metrics=["accuracy"])
    with pytest.raises(TraceError, match="two classes"):
        nn.to_graph(nn.Linear(4, 3), inputs={"x": (0, 4)}, metrics=["positive_score"])


def test_calling_a_module_outside_tracing() -> None:
    with pytest.raises(TraceError) as info:
        nn.Linear(4, 3)(np.ones((2, 4), np.float32))  # MARK-call
    assert info.value.lineno == line_of(test_calling_a_module_outside_tracing, "MARK-call")
    assert "outside tracing" in str(info.value)
