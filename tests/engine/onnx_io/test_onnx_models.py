"""The onnx package's light model zoo: every model imports, compiles for inference and
for training, matches onnxruntime, and trains with exactly its planned memory."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from engine import SGD, VM, compile_graph
from engine.onnx_io import import_onnx
from engine.onnx_io.light import data_input, light_models, randomized
from tests.allocations import step_allocations

MODELS = light_models()
SMALL = ["squeezenet", "shufflenet", "inception_v1"]


def outputs_match(name: str) -> None:
    import onnxruntime as ort

    m = randomized(onnx.load(MODELS[name]))
    inp = data_input(m)
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).random((2, *dims[1:]), dtype=np.float32)
    vm = VM(compile_graph(import_onnx(m, freeze=True), batch_size=2))
    vm.set(inp.name, x)
    vm.forward("infer")
    got = vm.get(m.graph.output[0].name)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {inp.name: x[i:i + 1]})[0] for i in range(2)])
    assert got.shape == want.shape
    assert float(want.std()) > 0  # random weights: the images differ
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def test_the_zoo_is_there() -> None:
    assert len(MODELS) == 9 and "resnet50" in MODELS


@pytest.mark.parametrize("name", SMALL)
def test_outputs_match_onnxruntime(name: str) -> None:
    outputs_match(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(SMALL)))
def test_outputs_of_the_big_models_match_onnxruntime(name: str) -> None:
    outputs_match(name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_compiles_for_inference_and_training(name: str) -> None:
    model = onnx.load(MODELS[name])
    infer = compile_graph(import_onnx(model, freeze=True), batch_size=4)
    train = compile_graph(import_onnx(model, loss="cross_entropy"), batch_size=4,
                          optimizer=SGD(lr=0.01, momentum=0.9))
    assert infer.zone_bytes["gradient"] == infer.zone_bytes["optimizer"] == 0
    assert train.zone_bytes["gradient"] > 0 and train.zone_bytes["optimizer"] > 0
    assert train.total_bytes > infer.total_bytes


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_an_imported_network_trains_with_exactly_its_planned_memory() -> None:
    """ShuffleNet (batch norm, grouped convolutions, 5-D transposes, Sum) for training:
    the loss falls on a fixed batch, the running statistics move, nothing is allocated."""
    m = randomized(onnx.load(MODELS["shufflenet"]))
    g = import_onnx(m, loss="cross_entropy")
    stats = [v for v in g.variables.values() if v.kind.value == "parameter" and not v.trainable]
    assert stats  # batch norm's running statistics: state, not weights
    prog = compile_graph(g, batch_size=2, optimizer=SGD(lr=1e-3))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    inp = data_input(m)
    vm.set(inp.name, np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32))
    vm.set("labels", np.array([3, 7]))
    before = vm.get(stats[0].name)
    losses = []
    for _ in range(4):
        vm.train_step("train")
        losses.append(float(vm.get("loss")))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert not np.array_equal(vm.get(stats[0].name), before)
    retained, peak = step_allocations(lambda: vm.train_step("train"), warmup=2, runs=5)
    # numpy's iteration buffer for strided adds (at most 8,192 elements an operand) is
    # all that a step allocates, and it is freed before the call returns
    assert retained < 4096 and peak <= 3 * 8192 * 4 + 4096


def exports_in_inference_mode(name: str) -> None:
    """Imported for training, trained one step, exported: the file passes the full
    checker, and onnxruntime gives what the original model gives with the trained
    weights and running statistics put in."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from engine.onnx_io import export_onnx

    m = randomized(onnx.load(MODELS[name]))
    g = import_onnx(m, loss="cross_entropy")
    inp = data_input(m)
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(2).random((2, *dims[1:]), dtype=np.float32)
    vm = VM(compile_graph(g, batch_size=2, optimizer=SGD(lr=1e-2, momentum=0.9)))
    vm.set(inp.name, x)
    vm.set("labels", np.array([3, 7]))
    vm.train_step("train")
    out = m.graph.output[0].name
    exported = export_onnx(g, outputs=[out], vm=vm)
    onnx.checker.check_model(exported, full_check=True)
    modes = [a.i for n in exported.graph.node if n.op_type == "BatchNormalization"
             for a in n.attribute if a.name == "training_mode"]
    assert not any(modes)
    trained = onnx.ModelProto()
    trained.CopyFrom(m)
    changed = 0
    for init in trained.graph.initializer:
        if init.name in g.variables:
            new = vm.get(init.name)
            changed += not np.array_equal(new, numpy_helper.to_array(init))
            init.CopyFrom(numpy_helper.from_array(np.asarray(new), init.name))
    assert changed  # the step moved the weights
    opts = ort.SessionOptions()
    opts.log_severity_level = 3

    def run(model: onnx.ModelProto) -> np.ndarray:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return np.concatenate([sess.run(None, {inp.name: x[i:i + 1]})[0] for i in range(2)])

    got, want = run(exported), run(trained)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


@pytest.mark.parametrize("name", SMALL)
def test_a_trained_model_exports_in_inference_mode(name: str) -> None:
    exports_in_inference_mode(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(SMALL)))
def test_a_trained_big_model_exports_in_inference_mode(name: str) -> None:
    exports_in_inference_mode(name)
