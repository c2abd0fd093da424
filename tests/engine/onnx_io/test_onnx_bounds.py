"""Hostile ONNX files end in a GraphError naming the node, in bounded time and memory:
constant folding is sized before it runs, control flow is folded only where it is
bounded, tensors are capped, programs larger than the machine do not compile, broken
external data and Constant values are engine errors; and a trained model with batch
norm and dropout exports as an inference model onnxruntime runs."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from engine import SGD, VM, CompileError, GraphError, compile_graph
from engine.compile import compiler
from engine.onnx_io import export_onnx, fold, import_onnx
from engine.onnx_io.fold import MAX_TRIPS
from engine.onnx_io.safety import MAX_FOLD_BYTES, MAX_FOLD_ELEMENTS, MAX_TENSOR_ELEMENTS
from tests.engine.onnx_io.test_onnx_safety import external, model, save

OPSET = 17


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"c_{name}",
                            value=numpy_helper.from_array(np.asarray(value), name))


def folded(nodes: list[onnx.NodeProto], out: str) -> onnx.ModelProto:
    """x + (a constant computed by ``nodes`` as ``out``): the constant is folded."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])
    graph = helper.make_graph([*nodes, helper.make_node("Add", ["x", out], ["y"], name="add")],
                              "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def refused(build: Callable[[], object], match: str, peak_bytes: int = 64 << 20
            ) -> GraphError:
    """The error, raised within 10 s having allocated under ``peak_bytes``."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(GraphError, match=match) as info:
            build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 10
    assert peak < peak_bytes, f"{peak:,} bytes allocated before refusing"
    return info.value


F32 = np.float32


@pytest.mark.parametrize("nodes,name", [
    ([const("one", np.ones((1, 1), F32)), const("s", np.array([40000, 40000])),
      helper.make_node("Expand", ["one", "s"], ["big"], name="expand"),
      helper.make_node("Neg", ["big"], ["z"], name="neg")], "expand"),
    ([const("a", np.array(0.0, F32)), const("b", np.array(1e9, F32)),
      const("d", np.array(1.0, F32)),
      helper.make_node("Range", ["a", "b", "d"], ["big"], name="range"),
      helper.make_node("Neg", ["big"], ["z"], name="neg")], "range"),
    ([const("one", np.ones((2, 2), F32)), const("r", np.array([30000, 30000])),
      helper.make_node("Tile", ["one", "r"], ["big"], name="tile"),
      helper.make_node("Neg", ["big"], ["z"], name="neg")], "tile"),
    # a broadcast view of 4e8 elements (under the tensor cap: no copy), materialised by
    # the Neg that reads it
    ([const("s", np.array([20000, 20000])),
      helper.make_node("ConstantOfShape", ["s"], ["big"], name="cos"),
      helper.make_node("Neg", ["big"], ["z"], name="neg")], "neg"),
    # an outer product by broadcasting: [40000, 1] * [1, 40000]
    ([const("s", np.array([40000, 1])), const("t", np.array([1, 40000])),
      helper.make_node("ConstantOfShape", ["s"], ["a"], name="cos_a"),
      helper.make_node("ConstantOfShape", ["t"], ["b"], name="cos_b"),
      helper.make_node("Mul", ["a", "b"], ["z"], name="outer")], "outer"),
])
def test_a_folded_constant_over_the_cap_is_refused_before_it_is_made(
        nodes: list[onnx.NodeProto], name: str) -> None:
    m = folded(nodes, "z")
    err = refused(lambda: import_onnx(m, freeze=True), rf"node '{name}'")
    assert "elements" in str(err) and f"{MAX_FOLD_ELEMENTS:,}" in str(err)


def test_a_constant_of_shape_over_the_tensor_cap_is_refused() -> None:
    nodes = [const("s", np.array([40000, 40000])),
             helper.make_node("ConstantOfShape", ["s"], ["z"], name="cos")]
    refused(lambda: import_onnx(folded(nodes, "z"), freeze=True),
            f"node 'cos'.*1,600,000,000 elements.*{MAX_TENSOR_ELEMENTS:,}")


def test_a_range_with_zero_delta_is_refused() -> None:
    nodes = [const("a", np.array(0, np.int64)), const("b", np.array(10, np.int64)),
             const("d", np.array(0, np.int64)),
             helper.make_node("Range", ["a", "b", "d"], ["r"], name="range"),
             helper.make_node("Cast", ["r"], ["z"], to=TensorProto.FLOAT, name="cast")]
    refused(lambda: import_onnx(folded(nodes, "z"), freeze=True), "node 'range'.*no finite")


def test_small_constant_subgraphs_still_fold() -> None:
    nodes = [const("one", np.ones((1, 1), F32)), const("s", np.array([1, 5])),
             helper.make_node("Expand", ["one", "s"], ["e"], name="expand"),
             const("a", np.array(0.0, F32)), const("b", np.array(5.0, F32)),
             const("d", np.array(1.0, F32)),
             helper.make_node("Range", ["a", "b", "d"], ["r"], name="range"),
             helper.make_node("Mul", ["e", "r"], ["z"], name="mul")]
    g = import_onnx(folded(nodes, "z"), freeze=True)
    vm = VM(compile_graph(g, batch_size=2))
    vm.set("x", np.ones((2, 1), F32))
    vm.forward("infer")
    assert vm.get("y").tolist() == [[1.0, 2.0, 3.0, 4.0, 5.0]] * 2


def loop_model(trips: int | None) -> onnx.ModelProto:
    """A Loop adding 1 to a carried scalar ``trips`` times (no trip count: until its
    condition, always true, turns false)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["v", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(1.0, F32), "one")])
    nodes = [const("cond", np.array(True)), const("v0", np.array(0.0, F32))]
    if trips is not None:
        nodes.append(const("m", np.array(trips, np.int64)))
    nodes.append(helper.make_node("Loop", ["m" if trips is not None else "", "cond", "v0"],
                                  ["z"], body=body, name="loop"))
    return folded(nodes, "z")


@pytest.mark.parametrize("trips,match", [(10**12, "trip count"), (MAX_TRIPS + 1, "trip count"),
                                         (None, "no trip count")])
def test_an_unbounded_loop_is_refused_before_it_runs(trips: int | None, match: str) -> None:
    refused(lambda: import_onnx(loop_model(trips), freeze=True), f"node 'loop'.*{match}")


def test_a_bounded_loop_folds() -> None:
    g = import_onnx(loop_model(3), freeze=True)
    vm = VM(compile_graph(g, batch_size=1))
    vm.set("x", np.zeros((1, 1), F32))
    vm.forward("infer")
    assert vm.get("y").tolist() == [[3.0]]


def _body(nodes: list[onnx.NodeProto], carried: list[tuple[str, str]],
          scans: tuple[str, ...] = (), inits: tuple[onnx.TensorProto, ...] = ()
          ) -> onnx.GraphProto:
    """A Loop body: (iteration, condition, carried ins) -> (condition, carried outs,
    scan outputs); ``carried`` pairs each carried input with its output."""
    vi = helper.make_tensor_value_info
    return helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), *nodes], "body",
        [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []),
         *(vi(c, TensorProto.FLOAT, None) for c, _ in carried)],
        [vi("cond_out", TensorProto.BOOL, []), *(vi(o, TensorProto.FLOAT, None)
                                                 for _, o in carried),
         *(vi(o, TensorProto.FLOAT, None) for o in scans)], list(inits))


def _loop(trips: int, body: onnx.GraphProto, outs: list[str], v0: np.ndarray) -> list:
    return [const("m", np.array(trips, np.int64)), const("cond", np.array(True)),
            const("v0", v0),
            helper.make_node("Loop", ["m", "cond", "v0"], outs, body=body, name="loop")]


def test_a_loop_that_doubles_its_value_is_refused_at_the_cap() -> None:
    """Concat(v, v) on every iteration: 2^40 elements after 40 iterations; the body
    node that would pass the cap is refused before it runs."""
    body = _body([helper.make_node("Concat", ["v", "v"], ["v_out"], axis=0, name="grow")],
                 [("v", "v_out")])
    nodes = _loop(40, body, ["big"], np.ones(1, F32))
    refused(lambda: import_onnx(folded([*nodes, helper.make_node(
        "ReduceSum", ["big"], ["z"], keepdims=1)], "z"), freeze=True),
        "node '(grow|loop)'.*at most", peak_bytes=3 * MAX_FOLD_BYTES)  # up to the cap


def test_a_loop_over_the_step_cap_is_refused_before_it_runs() -> None:
    from engine.onnx_io.control import MAX_LOOP_STEPS

    body = _body([helper.make_node("Neg", ["v"], ["w"]),
                  helper.make_node("Neg", ["w"], ["v_out"])], [("v", "v_out")])
    trips = MAX_LOOP_STEPS // 3 + 1  # under MAX_TRIPS, over the steps with 3 nodes
    assert trips <= MAX_TRIPS
    refused(lambda: import_onnx(folded(_loop(trips, body, ["z"], np.ones(1, F32)), "z"),
                                freeze=True), "node 'loop'.*node evaluations")


def test_a_loop_with_scan_outputs_folds_as_onnxruntime_runs_it() -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    body = _body([helper.make_node("Add", ["v", "one"], ["v_out"]),
                  helper.make_node("Mul", ["v_out", "v_out"], ["sq"])],
                 [("v", "v_out")], scans=("sq",),
                 inits=(numpy_helper.from_array(np.ones(3, F32), "one"),))
    nodes = [*_loop(4, body, ["last", "squares"], np.arange(3, dtype=F32)),
             helper.make_node("ReduceSum", ["squares", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["s", "last"], ["z3"]),
             helper.make_node("Reshape", ["z3", "shape"], ["z"])]
    nodes.insert(0, const("axes", np.array([0], np.int64)))
    nodes.insert(0, const("shape", np.array([1, 3], np.int64)))
    m = folded(nodes, "z")
    x = np.array([[0.5], [2.0]], F32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    vm = VM(compile_graph(import_onnx(m, freeze=True), batch_size=2))
    vm.set("x", x)
    vm.forward("infer")
    np.testing.assert_allclose(vm.get("y"), want)


def _if(cond: bool, then: list[onnx.NodeProto], other: list[onnx.NodeProto]
        ) -> list[onnx.NodeProto]:
    def branch(nodes: list[onnx.NodeProto], name: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(
            "r_" + name, TensorProto.FLOAT, None)])

    return [const("c", np.array(cond)),
            helper.make_node("If", ["c"], ["z"], name="if",
                             then_branch=branch(then, "then"),
                             else_branch=branch(other, "else"))]


def test_an_if_folds_the_branch_its_constant_condition_takes() -> None:
    for cond, want in ((True, 5.0), (False, -2.0)):
        nodes = [const("k", np.array([[2.0]], F32)), *_if(
            cond, [helper.make_node("Add", ["k", "k3"], ["r_then"]),
                   const("k3", np.array([[3.0]], F32))][::-1],
            [helper.make_node("Neg", ["k"], ["r_else"])])]
        vm = VM(compile_graph(import_onnx(folded(nodes, "z"), freeze=True), batch_size=1))
        vm.set("x", np.zeros((1, 1), F32))
        vm.forward("infer")
        assert vm.get("y").tolist() == [[want]]


def test_an_expand_hidden_in_an_if_branch_is_refused_before_it_runs() -> None:
    bomb = [const("one", np.ones((1, 1), F32)), const("s", np.array([40000, 40000])),
            helper.make_node("Expand", ["one", "s"], ["r_then"], name="expand")]
    nodes = _if(True, bomb, [const("r_else", np.ones((1, 1), F32))])
    refused(lambda: import_onnx(folded(nodes, "z"), freeze=True), "node 'expand'")


def test_a_loop_reading_the_data_is_not_folded_and_is_a_graph_error() -> None:
    """Its body reads x from the outer scope: not a constant, and the engine has no Loop
    op, so it is refused by name, not run."""
    body = _body([helper.make_node("Add", ["v", "x"], ["v_out"])], [("v", "v_out")])
    refused(lambda: import_onnx(folded(_loop(3, body, ["z"], np.ones(1, F32)), "z"),
                                freeze=True), "Loop")


@pytest.mark.slow  # 20 examples of up to a second each: CI's slow step runs it
@settings(max_examples=20, deadline=None)
@given(trips=st.integers(0, MAX_TRIPS * 4), grow=st.booleans(),
       width=st.integers(1, 1 << 12))
def test_loops_fold_or_are_refused_in_bounded_time(trips: int, grow: bool, width: int
                                                   ) -> None:
    """Any trip count, a body that doubles its value or negates it: folded exactly when
    every step is under the caps, else a GraphError naming the loop or its node."""
    from engine.onnx_io.control import MAX_LOOP_STEPS

    op = helper.make_node("Concat", ["v", "v"], ["v_out"], axis=0, name="grow") if grow \
        else helper.make_node("Neg", ["v"], ["v_out"], name="grow")
    nodes = [*_loop(trips, _body([op], [("v", "v_out")]), ["big"], np.ones(width, F32)),
             helper.make_node("ReduceSum", ["big"], ["z"], keepdims=1)]
    final = width * (2 ** trips if grow else 1)
    ok = trips <= MAX_TRIPS and trips * 2 <= MAX_LOOP_STEPS and final <= MAX_FOLD_ELEMENTS
    if not ok:
        refused(lambda: import_onnx(folded(nodes, "z"), freeze=True), "node '(loop|grow)'",
                peak_bytes=3 * MAX_FOLD_BYTES)
        return
    t0 = time.perf_counter()
    vm = VM(compile_graph(import_onnx(folded(nodes, "z"), freeze=True), batch_size=1))
    assert time.perf_counter() - t0 < 60
    vm.set("x", np.zeros((1, 1), F32))
    vm.forward("infer")
    assert vm.get("y").tolist() == [[float(final) if grow else width * (-1.0) ** trips]]


def test_an_input_over_the_tensor_cap_is_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1 << 34])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1 << 34])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                            [x], [y]),
                          opset_imports=[helper.make_opsetid("", OPSET)])
    refused(lambda: import_onnx(m), f"input 'x'.*{MAX_TENSOR_ELEMENTS:,}")


def test_a_program_larger_than_the_machine_does_not_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1 << 28])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1 << 28])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                            [x], [y]),
                          opset_imports=[helper.make_opsetid("", OPSET)])
    g = import_onnx(m)  # under the tensor cap: 1 GiB a row
    monkeypatch.setattr(compiler, "physical_memory", lambda: 4 << 30)
    with pytest.raises(CompileError, match=r"needs 8,589,934,592 bytes.*4,294,967,296"):
        compile_graph(g, batch_size=4)
    assert compiler.physical_memory is not None
    monkeypatch.undo()
    assert (compiler.physical_memory() or 0) > 0


# -- broken external data and Constant values ------------------------------------------

@pytest.mark.parametrize("info", [{"offset": "abc"}, {"length": "2 4"}, {"offset": "1e3"}])
def test_external_data_numbers_that_are_not_numbers(tmp_path: Path, info: dict) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 24)
    t = external("w", (3, 2), "weights.bin")
    for k, v in info.items():
        t.external_data.add(key=k, value=v)
    path = save(tmp_path, model(t))
    refused(lambda: import_onnx(path), "tensor 'w'.*not a number")


def test_external_data_location_with_a_nul_byte(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 24)
    path = save(tmp_path, model(external("w", (3, 2), "weights.bin\0../../etc/passwd")))
    refused(lambda: import_onnx(path), "tensor 'w'.*NUL byte")


def constant_model(node: onnx.NodeProto) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((3, 2), F32), "w")
    return model(w, nodes=[node, helper.make_node("MatMul", ["x", "w"], ["y"])])


def test_a_sparse_constant_is_a_graph_error() -> None:
    values = numpy_helper.from_array(np.array([1.0], F32), "v")
    indices = numpy_helper.from_array(np.array([0], np.int64), "i")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    node = helper.make_node("Constant", [], ["c"], name="sparse", sparse_value=sparse)
    refused(lambda: import_onnx(constant_model(node)), "node 'sparse'.*sparse_value")


@pytest.mark.parametrize("kind", ["value_string", "value"])
def test_a_string_constant_is_a_graph_error(kind: str) -> None:
    value = b"hello" if kind == "value_string" else helper.make_tensor(
        "s", TensorProto.STRING, [1], [b"hello"])
    node = helper.make_node("Constant", [], ["c"], name="text", **{kind: value})
    refused(lambda: import_onnx(constant_model(node)), "node 'text'")


# -- export after training ---------------------------------------------------------------

def bn_dropout_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(F32), n) for n, a in [
        ("w", rng.normal(size=(4, 3, 3, 3)) * 0.3), ("scale", np.ones(4)),
        ("bias", np.zeros(4)), ("mean", np.zeros(4)), ("var", np.ones(4)),
        ("fc", rng.normal(size=(4 * 4 * 4, 5)) * 0.3)]]
    inits.append(numpy_helper.from_array(np.array([-1, 64], np.int64), "flat"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 0, 0, 0]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d"], name="drop"),
             helper.make_node("Reshape", ["d", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["logits"])]
    graph = helper.make_graph(
        nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_a_trained_model_with_batch_norm_exports_in_inference_mode(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    g = import_onnx(bn_dropout_model(), loss="cross_entropy")
    vm = VM(compile_graph(g, batch_size=4, optimizer=SGD(lr=0.05)))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3, 6, 6)).astype(F32)
    vm.set("x", x)
    vm.set("labels", np.array([0, 1, 2, 3]))
    for _ in range(3):
        vm.train_step("train")
    assert not np.allclose(vm.get("mean"), 0)  # the running statistics moved
    exported = export_onnx(g, outputs=["logits"], vm=vm)
    bn = [n for n in exported.graph.node if n.op_type == "BatchNormalization"]
    assert len(bn) == 1 and len(bn[0].output) == 1
    assert {a.name: helper.get_attribute_value(a) for a in bn[0].attribute}.get(
        "training_mode", 0) == 0
    assert "Dropout" not in {n.op_type for n in exported.graph.node}
    onnx.checker.check_model(exported, full_check=True)
    path = tmp_path / "trained.onnx"
    path.write_bytes(exported.SerializeToString())
    got = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    # the same model in inference mode, by hand: running statistics, no dropout
    c = ort.InferenceSession(helper.make_model(
        helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"])], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(vm.get("w"), "w")]),
        opset_imports=[helper.make_opsetid("", OPSET)]).SerializeToString()).run(
            None, {"x": x})[0]
    mean, var = vm.get("mean").reshape(1, 4, 1, 1), vm.get("var").reshape(1, 4, 1, 1)
    b = (c - mean) / np.sqrt(var + 1e-5) * vm.get("scale").reshape(1, 4, 1, 1) + \
        vm.get("bias").reshape(1, 4, 1, 1)
    want = np.maximum(b, 0).reshape(4, 64) @ vm.get("fc")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- generated: constant subgraphs of growing size ------------------------------------

def _grown(op: str, a: int, b: int) -> tuple[list[onnx.NodeProto], int]:
    """A constant of ``a * b`` elements (``b`` for Range) made by ``op``, read by a Neg."""
    if op == "Expand":
        nodes = [const("one", np.ones((1, 1), F32)), const("s", np.array([a, b])),
                 helper.make_node("Expand", ["one", "s"], ["big"], name="make")]
    elif op == "Tile":
        nodes = [const("one", np.ones((1, 1), F32)), const("s", np.array([a, b])),
                 helper.make_node("Tile", ["one", "s"], ["big"], name="make")]
    elif op == "Range":
        nodes = [const("a", np.array(0.0, F32)), const("b", np.array(float(a * b), F32)),
                 const("d", np.array(1.0, F32)),
                 helper.make_node("Range", ["a", "b", "d"], ["big"], name="make")]
    else:
        nodes = [const("s", np.array([a, b])),
                 helper.make_node("ConstantOfShape", ["s"], ["big"], name="make",
                                  value=numpy_helper.from_array(np.ones(1, F32), "v"))]
    return [*nodes, helper.make_node("Neg", ["big"], ["z"], name="neg")], a * b


# The folding caps made 64 times smaller for the generated sizes below: the same
# boundary between folding and refusing, at most 4 MB folded (a fold near the real cap,
# 256 MB, peaks at about five times that in the test process).
SMALL_FOLD = {"MAX_FOLD_ELEMENTS": MAX_FOLD_ELEMENTS >> 6, "MAX_FOLD_BYTES": MAX_FOLD_BYTES >> 6}


@settings(max_examples=25, deadline=None)
@given(op=st.sampled_from(["Expand", "Tile", "Range", "ConstantOfShape"]),
       a=st.integers(1, 1 << 14), b=st.integers(1, 1 << 14))
def test_growing_constants_fold_or_are_refused_in_bounded_time(op: str, a: int, b: int
                                                               ) -> None:
    """Under the cap a constant folds; over it, a GraphError comes before it is made."""
    nodes, n = _grown(op, a, b)
    if op == "Range":
        n = int(np.float32(a * b))  # the limit as a float32 holds it
    m = folded(nodes, "z")
    with mock.patch.multiple(fold, **SMALL_FOLD):
        if n > SMALL_FOLD["MAX_FOLD_ELEMENTS"] or n * 4 > SMALL_FOLD["MAX_FOLD_BYTES"]:
            refused(lambda: import_onnx(m, freeze=True), "node '(make|neg)'")
        else:
            t0 = time.perf_counter()
            import_onnx(m, freeze=True)
            assert time.perf_counter() - t0 < 30
