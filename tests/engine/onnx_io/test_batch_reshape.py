"""Models exported by PyTorch with a dynamic batch compute their reshape targets and
slice bounds from ``Shape`` at run time; they import, at any batch size, with the
outputs of PyTorch (engine.onnx_io.batch_reshape).  What really computes with the batch
size is still refused, and a weight is never frozen into a constant."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import VM, compile_graph
from engine.errors import GraphError
from engine.onnx_io import import_onnx

torch = pytest.importorskip("torch")
tnn = torch.nn


class Flatten(tnn.Module):
    """The classic CNN: ``h.view(h.size(0), -1)`` before the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = tnn.Conv2d(1, 4, 3)
        self.fc = tnn.Linear(4 * 6 * 6, 3)

    def forward(self, x: Any) -> Any:
        h = torch.relu(self.conv(x))
        return self.fc(h.view(h.size(0), -1))


class Causal(tnn.Module):
    """nanoGPT's block: views by ``x.size()``, the mask a buffer sliced to ``T``."""

    def __init__(self, d: int = 16, heads: int = 2, length: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.ln = tnn.LayerNorm(d)
        self.c_attn = tnn.Linear(d, 3 * d)
        self.c_proj = tnn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(length, length))
                             .view(1, 1, length, length))
        self.head = tnn.Linear(d, 5)

    def forward(self, x: Any) -> Any:
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.head(x + self.c_proj(y)).mean(dim=1)


def exported(model: Any, x: Any) -> Any:
    import onnx

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(model, (x,), f, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                          dynamo=False, opset_version=17)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("make,shape", [(Flatten, (1, 8, 8)), (Causal, (8, 16))])
def test_a_dynamic_batch_export_imports_at_any_batch(make: Any, shape: tuple[int, ...]
                                                     ) -> None:
    torch.manual_seed(0)
    model = make().eval()
    proto = exported(model, torch.randn(2, *shape))
    assert "Shape" in {n.op_type for n in proto.graph.node}  # computed at run time there
    g = import_onnx(proto)
    for batch in (3, 7):
        x = torch.randn(batch, *shape)
        vm = VM(compile_graph(g, batch_size=batch))
        vm.set("x", x.numpy())
        vm.forward("infer")
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(vm.get("y"), want, rtol=1e-5, atol=1e-5)


def _reshape_model(rest: list[helper.NodeProto]) -> Any:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]), *rest,
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_the_batch_size_first_in_a_target_is_kept() -> None:
    g = import_onnx(_reshape_model([helper.make_node("Concat", ["b1", "rest"], ["target"],
                                                     axis=0)]))
    vm = VM(compile_graph(g, batch_size=4))
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    vm.set("x", x)
    vm.forward("infer")
    np.testing.assert_array_equal(vm.get("y"), x.reshape(4, 6))


@pytest.mark.parametrize("rest", [
    # x.view(b * 2, -1): arithmetic on the batch size
    [helper.make_node("Mul", ["b1", "two"], ["b2"]),
     helper.make_node("Concat", ["b2", "rest"], ["target"], axis=0)],
    # the batch size second
    [helper.make_node("Concat", ["rest", "b1"], ["target"], axis=0)],
])
def test_what_computes_with_the_batch_size_is_still_refused(rest: list[Any]) -> None:
    """...saying why: the input comes from a Shape, and what to export instead."""
    with pytest.raises(GraphError, match=r"must be a constant, and it is computed at run "
                                         r"time from a Shape.*arithmetic on the batch size"):
        import_onnx(_reshape_model(rest))


def test_a_small_weight_is_never_read_as_a_constant() -> None:
    """A trained initializer of four values feeding the data stays a parameter."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Identity", ["w"], ["w1"]),
             helper.make_node("Add", ["x", "w1"], ["y"])]
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    g = import_onnx(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                                      opset_imports=[helper.make_opsetid("", 17)]))
    assert g.variables["w"].trainable


def test_the_callers_model_is_not_changed() -> None:
    """Imported twice, the model is still valid and the same bytes."""
    import onnx

    model = _reshape_model([helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0)])
    before = model.SerializeToString()
    import_onnx(model)
    import_onnx(model)
    onnx.checker.check_model(model)
    assert model.SerializeToString() == before


def test_a_loss_that_is_no_graph_output_stays() -> None:
    """A value the model computes but does not output, named as the loss, is kept
    while the shape chain beside it goes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["xw", "target"], ["y"]),
             helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("ReduceMean", ["xw"], ["objective"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest"),
             numpy_helper.from_array(np.full((2, 3), 2.0, np.float32), "w")]
    nodes = nodes[5:6] + nodes[:5] + nodes[6:]  # producers first
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model, loss="objective")
    vm = VM(compile_graph(g, batch_size=3))
    vm.set("x", np.ones((3, 2, 3), np.float32))
    vm.forward("train")
    assert float(vm.get("objective")) == pytest.approx(2.0)


def test_a_reshape_with_allowzero_is_not_rewritten() -> None:
    """With ``allowzero`` a 0 in the target is a zero-size dimension, not a copy."""
    model = _reshape_model([helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0)])
    for node in model.graph.node:
        if node.op_type == "Reshape":
            node.attribute.append(helper.make_attribute("allowzero", 1))
    with pytest.raises(GraphError, match="must be a constant"):
        import_onnx(model)
