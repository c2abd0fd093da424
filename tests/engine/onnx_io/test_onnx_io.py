"""ONNX export (checked by running the file in onnxruntime) and import (checked
against onnxruntime on models built with onnx.helper)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import VM, Adam, CalcGraph, GraphError, Init, Mode, compile_graph
from engine.models import paper_mlp
from engine.onnx_io import export_onnx, import_onnx

R = np.random.default_rng(11)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def trained_losses(model: onnx.ModelProto, x: np.ndarray, steps: int) -> tuple[VM, list[float]]:
    """``model`` imported with a cross-entropy loss, trained ``steps`` Adam steps on
    ``x`` (labels 0, 1, ...): its VM and each step's loss."""
    vm = VM(compile_graph(import_onnx(model, loss="cross_entropy"), batch_size=len(x),
                          optimizer=Adam(lr=1e-2)))
    vm.feed({"x": x, "labels": np.arange(len(x)) % 6})
    losses = []
    for _ in range(steps):
        vm.train_step("train")
        losses.append(float(vm.get("loss")))
    return vm, losses


def engine_run(g: CalcGraph, feeds: dict[str, np.ndarray], outputs: list[str],
               path: str = "infer") -> list[np.ndarray]:
    batch = next(iter(feeds.values())).shape[0]
    vm = VM(compile_graph(g, batch_size=batch))
    vm.feed(feeds)
    vm.forward(path)
    return [vm.get(o) for o in outputs]


def test_a_trained_mlp_exports_and_runs_in_onnxruntime() -> None:
    g = paper_mlp((20, 16, 5), dropout=0.2)
    vm = VM(compile_graph(g, batch_size=8, optimizer=Adam(lr=0.05)))
    x = R.random((8, 20), dtype=np.float32)
    vm.set("x", x)
    vm.set("y", R.integers(0, 5, 8))
    for _ in range(5):
        vm.train_step("train")
    model = export_onnx(g, outputs=["eval_logits"], vm=vm)
    assert "Dropout" not in {n.op_type for n in model.graph.node}
    (got,) = ort_run(model, {"x": x})
    vm.forward("eval")
    w0, b0, w1, b1 = (vm.get(n) for n in ("w0", "b0", "w1", "b1"))
    expected = (1 / (1 + np.exp(-(x @ w0 + b0)))) @ w1 + b1  # the trained weights
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_constant_the_compiler_simplified_away_exports_with_its_value() -> None:
    """``x - 0`` (a padding id of 0 subtracted, say) compiles to ``x``: the 0 is in no
    program, and the trained model still exports, the constant's value from its init."""
    from engine import nn

    class Shifted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: object) -> object:
            return self.lin((x - 0.0) * 2.0)

    g = nn.to_graph(Shifted(), inputs={"x": (0, 4)}, loss="mse", target_shape=(0, 3))
    vm = VM(compile_graph(g, batch_size=4, optimizer=Adam(lr=0.05)))
    assert [v for v, var in g.variables.items() if var.init is not None
            and var.init.values == (0.0,)]  # the 0 is a frozen constant of the graph
    x = R.random((4, 4), dtype=np.float32)
    vm.set("x", x)
    vm.set("y", R.random((4, 3), dtype=np.float32))
    vm.train_step("train")
    (got,) = ort_run(export_onnx(g, outputs=["logits"], vm=vm), {"x": x})
    vm.forward("eval")
    np.testing.assert_allclose(got, vm.get("logits"), rtol=1e-5, atol=1e-6)


def cnn() -> CalcGraph:
    g = CalcGraph(name="cnn")
    x = g.placeholder("x", (0, 2, 9, 9))
    w = g.parameter("w", (4, 2, 3, 3), init=Init.he_uniform())
    b = g.parameter("b", (4,), init=Init.uniform(-0.1, 0.1))
    fc = g.parameter("fc", (4 * 16, 3), init=Init.xavier_uniform())
    p = g.path("infer", Mode.FORWARD_ONLY)
    h = p.MaxPool(p.Relu(p.Conv(x, w, b, pads=(1, 1, 1, 1))), kernel_shape=(2, 2),
                  strides=(2, 2))
    h = p.Reshape(h, shape=(0, -1))
    p.Softmax(p.MatMul(h, fc), outputs=["probs"])
    g.output("probs")
    return g


def test_a_cnn_exports_and_matches_onnxruntime() -> None:
    g = cnn()
    x = R.random((3, 2, 9, 9), dtype=np.float32)
    model = export_onnx(g)
    (got,) = ort_run(model, {"x": x})
    (ours,) = engine_run(g, {"x": x}, ["probs"])
    np.testing.assert_allclose(ours, got, rtol=1e-5, atol=1e-6)


def test_import_runs_what_onnxruntime_runs() -> None:
    w = R.normal(size=(6, 4)).astype(np.float32)
    b = R.normal(size=(4,)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Dropout", ["r"], ["d"]),
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(
            np.array(2.0, np.float32))),
        helper.make_node("Mul", ["d", "two"], ["m"]),
        helper.make_node("Reshape", ["m", "shape"], ["s"]),
        helper.make_node("ReduceSum", ["s", "axes"], ["out"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([0, 2, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([2], np.int64), "axes")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 6])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, ["N", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = R.random((5, 6), dtype=np.float32)
    (want,) = ort_run(model, {"x": x})
    g = import_onnx(model)
    assert g.variables["w"].trainable and not g.variables["two"].trainable
    (got,) = engine_run(g, {"x": x}, ["out"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not import_onnx(model, freeze=True).variables["w"].trainable


def test_export_then_import_is_the_same_function() -> None:
    g = cnn()
    x = R.random((2, 2, 9, 9), dtype=np.float32)
    back = import_onnx(export_onnx(g))
    np.testing.assert_allclose(engine_run(back, {"x": x}, ["probs"])[0],
                               engine_run(g, {"x": x}, ["probs"])[0], rtol=1e-6)


def test_unsupported_operators_are_listed_together() -> None:
    nodes = [helper.make_node("Acos", ["x"], ["a"]), helper.make_node("Round", ["a"], ["b"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3])], [helper.make_tensor_value_info(
            "b", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(GraphError, match=r"unsupported ONNX operator.*Acos, Round"):
        import_onnx(model)


@pytest.mark.parametrize("opset", [17, 20])
def test_the_activations_of_newer_networks_import_train_and_export(opset: int) -> None:
    """GELU (one node from opset 20, Erf and products before, as PyTorch writes
    them), HardSwish (MobileNetV3), Mish, Selu, Celu and PRelu (a slope per feature,
    learnt): imported, they compute what onnxruntime computes, train, and export as a
    model onnxruntime runs (Mish, of opset 18, written out for the exporter's opset 17)."""
    w = R.normal(size=(6, 6)).astype(np.float32)
    if opset >= 20:
        gelu = [helper.make_node("Gelu", ["h"], ["a"])]
    else:
        gelu = [helper.make_node("Div", ["h", "root2"], ["z"]),
                helper.make_node("Erf", ["z"], ["e"]),
                helper.make_node("Add", ["e", "one"], ["e1"]),
                helper.make_node("Mul", ["h", "e1"], ["he"]),
                helper.make_node("Mul", ["he", "half"], ["a"])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), *gelu,
             helper.make_node("HardSwish", ["a"], ["b"]),
             *([helper.make_node("Mish", ["b"], ["c"])] if opset >= 18 else
               [helper.make_node("Identity", ["b"], ["c"])]),
             helper.make_node("Selu", ["c"], ["c1"]),
             helper.make_node("Celu", ["c1"], ["c2"], alpha=0.7),
             helper.make_node("PRelu", ["c2", "slope"], ["c3"]),
             helper.make_node("MatMul", ["c3", "w"], ["out"])]
    consts = {"w": w, "root2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0),
              "half": np.float32(0.5), "slope": R.uniform(0.1, 0.3, 6).astype(np.float32)}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 6])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, ["N", 6])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    x = (3 * R.normal(size=(7, 6))).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    g = import_onnx(model)
    (got,) = engine_run(g, {"x": x}, ["out"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    trained = import_onnx(model, loss="cross_entropy")
    vm, losses = trained_losses(model, x, 20)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert trained.variables["slope"].trainable
    assert not np.allclose(vm.get("slope"), consts["slope"])
    (again,) = ort_run(export_onnx(g, outputs=["out"]), {"x": x})
    np.testing.assert_allclose(again, want, rtol=1e-5, atol=1e-5)


def test_instance_normalization_imports_and_trains_as_group_norm_exports() -> None:
    """PyTorch writes GroupNorm as InstanceNormalization over the groups (a reshape to
    [N, groups, -1], unit scale) and its affine step after: imported, it computes what
    onnxruntime computes, and its scale and shift train."""
    nodes = [helper.make_node("Reshape", ["x", "groups"], ["xg"]),
             helper.make_node("InstanceNormalization", ["xg", "ones", "zeros"], ["n"],
                              epsilon=1e-3),
             helper.make_node("Reshape", ["n", "back"], ["nb"]),
             helper.make_node("Mul", ["nb", "gamma"], ["ng"]),
             helper.make_node("Add", ["ng", "beta"], ["h"]),
             helper.make_node("Flatten", ["h"], ["out"])]
    consts = {"groups": np.array([0, 2, -1], np.int64), "back": np.array([0, 4, 3, 3], np.int64),
              "ones": np.ones(2, np.float32), "zeros": np.zeros(2, np.float32),
              "gamma": R.uniform(0.5, 1.5, (4, 1, 1)).astype(np.float32),
              "beta": R.normal(size=(4, 1, 1)).astype(np.float32)}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 3, 3])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, ["N", 36])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = R.normal(size=(5, 4, 3, 3)).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    (got,) = engine_run(import_onnx(model), {"x": x}, ["out"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    vm, losses = trained_losses(model, x, 10)
    assert losses[-1] < losses[0] and not np.allclose(vm.get("ones"), 1.0)


@pytest.mark.parametrize(("transform", "rounding", "scales", "refused"), [
    ("asymmetric", "floor", [1, 1, 2, 3], None),  # as PyTorch's Upsample writes it
    ("half_pixel", "round_prefer_floor", [1, 1, 3, 2], None),  # ONNX's defaults
    ("asymmetric", "round_prefer_ceil", [1, 1, 3, 3], "do not repeat each element"),
    ("asymmetric", "floor", [1, 1, 1.5, 2], "scale 1.5 on axis 2"),
])
def test_nearest_upsampling_imports_trains_and_exports(
        transform: str, rounding: str, scales: list[float], refused: str | None) -> None:
    """Resize as nearest upsampling by whole factors: what onnxruntime computes, with a
    gradient, and exported as a model that computes it again; another form is refused
    by name (UnsupportedForm), never computed differently."""
    from engine.errors import UnsupportedForm

    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode=transform, nearest_mode=rounding),
             helper.make_node("Mul", ["up", "w"], ["h"]),
             helper.make_node("Flatten", ["h"], ["out"])]
    out_hw = int(3 * scales[2]) * int(2 * scales[3])
    w = R.normal(size=(1, 2, int(3 * scales[2]), int(2 * scales[3]))).astype(np.float32)
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 2, 3, 2])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, ["N", 2 * out_hw])],
        [numpy_helper.from_array(np.array(scales, np.float32), "scales"),
         numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if refused:
        with pytest.raises(UnsupportedForm, match=refused):
            import_onnx(model)
        return
    x = R.normal(size=(4, 2, 3, 2)).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    g = import_onnx(model)
    (got,) = engine_run(g, {"x": x}, ["out"])
    np.testing.assert_array_equal(got, want)
    (again,) = ort_run(export_onnx(g, outputs=["out"]), {"x": x})
    np.testing.assert_array_equal(again, want)
    _, losses = trained_losses(model, x, 10)
    assert losses[-1] < losses[0]


def test_metrics_have_no_onnx_form() -> None:
    with pytest.raises(GraphError, match="no ONNX form for: Accuracy"):
        export_onnx(paper_mlp((4, 3, 2)), outputs=["accuracy"])


def test_the_new_operators_export_and_match_onnxruntime() -> None:
    """Slice, Pad, Gather, Pow, LRN, BatchNormalization (inference), LayerNormalization,
    Sum, Cast, DequantizeLinear and a Reduce* op: export, run in onnxruntime, compare."""
    g = CalcGraph(name="ops")
    x = g.placeholder("x", (0, 4, 6, 5))
    q = g.placeholder("q", (0, 7), dtype="uint8")
    table = g.parameter("table", (6, 3), init=Init.uniform(-1, 1))
    idx = g.constant([5, 0, 2], dtype="int64", shape=(3,))
    s, b = (g.parameter(n, (4,), init=Init.uniform(0.5, 1.5)) for n in "sb")
    m, v = (g.parameter(n, (4,), init=Init.uniform(0.5, 1.5), trainable=False) for n in "mv")
    ln_s = g.parameter("ln_s", (4,), init=Init.uniform(0.5, 1.5))
    p = g.path("infer", Mode.FORWARD_ONLY)
    h = p.BatchNormalization(x, s, b, m, v)
    h = p.LRN(h, size=3, alpha=0.01, beta=0.75, bias=1.0)
    h = p.Pad(p.Slice(h, starts=(1, 5), ends=(4, 0), axes=(2, 3), steps=(1, -2)),
              pads=(0, 0, 1, 1, 0, 0, 2, 1), mode="reflect")
    h = p.LayerNormalization(p.Pow(p.Sum(h, h, p.Abs(h)), p.Cast(g.constant(2.0), to="int64")),
                             ln_s)
    red = p.ReduceLogSumExp(h, axes=(1, 3), keepdims=0, outputs=["red"])
    gat = p.Gather(table, idx, axis=0, outputs=["gathered"])
    deq = p.DequantizeLinear(q, scale=0.5, zero_point=3, outputs=["deq"])
    g.output(red, gat, deq)
    feeds = {"x": R.normal(size=(2, 4, 6, 5)).astype(np.float32),
             "q": R.integers(0, 255, size=(2, 7)).astype(np.uint8)}
    model = export_onnx(g, outputs=["red", "gathered", "deq"])
    got = ort_run(model, feeds)
    ours = engine_run(g, feeds, ["red", "gathered", "deq"])
    for o, t in zip(ours, got, strict=True):
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_every_initializer_of_an_export_is_read(approximate: str) -> None:
    """No initializer that no node reads (onnxruntime warns of each): a GELU's export
    carries the constants of its own form only."""
    from engine import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.act = nn.GELU(approximate=approximate)

        def forward(self, x: object) -> object:
            return self.act(self.lin(x))

    g = nn.to_graph(Net(), inputs={"x": (0, 4)}, loss="mse", target_shape=(0, 3))
    vm = VM(compile_graph(g, batch_size=2))
    model = export_onnx(g, outputs=["logits"], vm=vm)
    read = {i for n in model.graph.node for i in n.input}
    assert [t.name for t in model.graph.initializer if t.name not in read] == []
    x = R.random((2, 4), dtype=np.float32)
    (got,) = ort_run(model, {"x": x})
    vm.set("x", x)
    vm.forward("eval")
    np.testing.assert_allclose(got, vm.get("logits"), rtol=1e-5, atol=1e-6)
