"""Family onnx: a model of the user's from an ONNX file, searched and trained.

Two source models: one written by the engine's exporter (always; a batch norm, a
dropout and a final softmax, Gemm weights [in, out]) and one exported from PyTorch
(Gemm weights [out, in], ``transB=1``; skipped without torch).  Both are CNNs for 8x8
images.  The family's eval logits equal the source's outputs before training; frozen
parameters stay as the file has them; ``head`` re-initialises and resizes to the data
set's outputs; the programs keep the exact-memory promise; a whole ``explore run`` on
digits keeps models whose export gives the engine's predictions in onnxruntime; a bad
``model`` section is refused with its file, line and key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine import SGD, VM, CalcGraph, Init, Kind, Mode, compile_graph
from engine.onnx_io import export_onnx
from explore.binding import bind
from explore.families import BuildError, get
from explore.space import load_space, parse_space
from explore.yamlio import SpaceError
from tests.allocations import step_allocations
from tests.explore.cli_run import explore_here
from tests.planverify import assert_no_clobber

ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
ROOT = Path(__file__).resolve().parents[3]
ONNX = get("onnx")


def engine_cnn(path: Path, classes: int = 3, seed: int = 0) -> Path:
    """An 8x8-image CNN written by the engine's exporter: conv, batch norm, relu, max
    pool, flatten, dense, relu, dropout (ONNX's Dropout, ratio 0.25), dense, softmax."""
    rng = np.random.default_rng(seed)
    g = CalcGraph(name="engine_cnn")
    x = g.placeholder("image", (0, 1, 8, 8))

    def param(name: str, shape: tuple[int, ...], scale: float = 0.3, trainable: bool = True,
              low: float | None = None) -> Any:
        values = rng.uniform(low, 1.5, shape) if low is not None else \
            rng.normal(0.0, scale, shape)
        return g.parameter(name, shape, init=Init.from_array(values), trainable=trainable)

    conv_w, conv_b = param("conv.w", (4, 1, 3, 3)), param("conv.b", (4,))
    bn = (param("bn.scale", (4,), low=0.5), param("bn.shift", (4,)),
          param("bn.mean", (4,), 0.1, trainable=False),
          param("bn.var", (4,), trainable=False, low=0.5))
    fc1_w, fc1_b = param("fc1.w", (64, 16)), param("fc1.b", (16,))
    fc2_w, fc2_b = param("fc2.w", (16, classes)), param("fc2.b", (classes,))
    p = g.path("infer", Mode.FORWARD_ONLY)
    h = p.BatchNormalization(p.Conv(x, conv_w, conv_b, pads=(1, 1, 1, 1)), *bn)
    h = p.Flatten(p.MaxPool(p.Relu(h), kernel_shape=(2, 2), strides=(2, 2)))
    h = p.Relu(p.Gemm(h, fc1_w, fc1_b))
    h = p.Dropout(h, ratio=0.25, outputs=["dropped"])
    h = p.Gemm(h, fc2_w, fc2_b)
    g.output(p.Softmax(h, axis=1, outputs=["probs"]))
    model = export_onnx(g, outputs=["probs"])
    # The exporter writes Dropout as the Identity it is at inference; a file from a
    # training framework keeps ONNX's Dropout, whose ratio is an input.
    for n in model.graph.node:
        if n.op_type == "Identity" and n.output[0] == "dropped":
            n.op_type = "Dropout"
            n.input.append("ratio")
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.25, np.float32),
                                                           "ratio"))
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def torch_cnn(path: Path, classes: int = 3, seed: int = 0) -> Path:
    """The same shape of CNN in PyTorch (no batch norm: its export folds it into the
    convolution), exported by the legacy exporter."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    torch.manual_seed(seed)
    nn = torch.nn
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(1, 4, 3, padding=1))
    model.add_module("relu", nn.ReLU())
    model.add_module("pool", nn.MaxPool2d(2))
    model.add_module("flat", nn.Flatten())
    model.add_module("fc1", nn.Linear(64, 16))
    model.add_module("relu1", nn.ReLU())
    model.add_module("fc2", nn.Linear(16, classes))
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), str(path), dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    return path


MAKERS = {"engine": engine_cnn, "torch": torch_cnn}
# the names each maker gives its convolution and its first and last dense layers
NAMES = {"engine": ("conv.w", "fc1.w", "fc2.w", "fc2.b"),
         "torch": ("conv.weight", "fc1.weight", "fc2.weight", "fc2.bias")}


def data(classes: int = 3, pixel_scale: float | None = None,
         task: str = "classification") -> Any:
    """What a family reads of a data set: 8x8 images as rows of 64 features."""
    return SimpleNamespace(features=64, classes=0 if task == "regression" else classes,
                           image=(1, 8, 8), pixel_scale=pixel_scale, task=task)


def params(path: Path, **kw: Any) -> dict[str, Any]:
    return {"onnx": str(path), "freeze": [], "head": 0, "loss": "auto", **kw}


def rows(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (n, 64)).astype(np.float32), rng.integers(0, 3, n)


def run_source(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path))
    (inp,) = sess.get_inputs()
    return sess.run(None, {inp.name: x.reshape(-1, 1, 8, 8)})[0]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(params=sorted(MAKERS))
def source(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    kind = request.param
    return kind, MAKERS[kind](tmp_path / f"{kind}.onnx")


def test_the_eval_logits_are_the_source_models_outputs(source: tuple[str, Path]) -> None:
    kind, path = source
    g = ONNX.build(params(path), data())
    assert [p.name for p in g.paths] == ["train", "eval"]
    assert g.outputs == ["loss", "accuracy", "class_counts", "eval_loss"]
    vm = VM(compile_graph(g, batch_size=50, optimizer=SGD(lr=0.1), keep=["logits"]))
    x, y = rows(50)
    vm.set("x", x)
    vm.set("y", y)
    vm.forward("eval")
    want = run_source(path, x)
    got = vm.get("logits")
    # the engine's model ends in a softmax, which the family leaves out of its logits
    np.testing.assert_allclose(softmax(got) if kind == "engine" else got, want,
                               rtol=1e-4, atol=1e-5)


def test_uint8_pixels_are_dequantized_first(tmp_path: Path) -> None:
    path = engine_cnn(tmp_path / "m.onnx")
    g = ONNX.build(params(path), data(pixel_scale=1 / 16))
    assert g.variables["x"].desc.dtype.value == "uint8"  # type: ignore[union-attr]
    assert g.paths[1].nodes[0].op == "DequantizeLinear"
    pixels = np.random.default_rng(2).integers(0, 17, (20, 64)).astype(np.uint8)
    vm = VM(compile_graph(g, batch_size=20, keep=["logits"]))
    vm.set("x", pixels)
    vm.forward("eval")
    np.testing.assert_allclose(softmax(vm.get("logits")),
                               run_source(path, pixels.astype(np.float32) / 16),
                               rtol=1e-4, atol=1e-5)


def trained(g: CalcGraph, steps: int = 5) -> tuple[dict[str, np.ndarray], VM]:
    """The parameters' initial values, and a VM after ``steps`` training steps."""
    vm = VM(compile_graph(g, batch_size=32, optimizer=SGD(lr=0.1)))
    before = {k: vm.get(k).copy() for k, v in g.variables.items() if v.kind is Kind.PARAMETER}
    x, y = rows(32)
    vm.set("x", x)
    vm.set("y", y)
    for _ in range(steps):
        vm.train_step("train")
    return before, vm


def test_frozen_parameters_stay_as_the_file_has_them(source: tuple[str, Path]) -> None:
    kind, path = source
    conv = NAMES[kind][0]
    freeze = ["conv.*", "bn.*"] if kind == "engine" else ["conv.*"]
    g = ONNX.build(params(path, freeze=freeze), data())
    before, vm = trained(g)
    for name, value in before.items():
        moved = not np.array_equal(vm.get(name), value)
        if name.startswith(("conv.", "bn.")):
            assert not moved, f"{name} is frozen, yet it changed"
        else:
            assert moved, f"{name} is trained, yet it did not change"
    # without freeze, the convolution trains and the batch norm's statistics move
    before, vm = trained(ONNX.build(params(path), data()))
    assert not np.array_equal(vm.get(conv), before[conv])
    if kind == "engine":
        assert not np.array_equal(vm.get("bn.mean"), before["bn.mean"])


def test_the_train_path_drops_out_and_normalises_by_batch(tmp_path: Path) -> None:
    g = ONNX.build(params(engine_cnn(tmp_path / "m.onnx")), data())
    ev = g.paths[1]
    ops = {p.name: {n.op: n for n in p.nodes} for p in g.paths}
    assert ops["train"]["Dropout"].attrs["ratio"] == pytest.approx(0.25)
    assert "Dropout" not in ops["eval"]
    assert ops["train"]["BatchNormalization"].attrs["training_mode"] == 1
    assert ops["train"]["BatchNormalization"].attrs["running_update"] == 1
    assert ops["eval"]["BatchNormalization"].attrs.get("training_mode", 0) == 0
    assert "Softmax" not in ops["eval"] and ev.nodes[-4].outputs == ("logits",)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_head_reinitialises_and_resizes_the_last_layers(source: tuple[str, Path],
                                                        task: str) -> None:
    """A 3-class model for digits' 10 classes, or a regression's one output."""
    kind, path = source
    conv, fc1, fc2, fc2_b = NAMES[kind]
    outputs = 1 if task == "regression" else 10
    ds = data(10, task=task)
    with pytest.raises(BuildError, match=r"gives 3 scores a row.*head: 1"):
        ONNX.build(params(path), ds)
    g = ONNX.build(params(path, head=2, loss="mse" if task == "regression" else "auto"), ds)
    file = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    vm = VM(compile_graph(g, batch_size=16, optimizer=SGD(lr=0.1), keep=["logits"]))
    out_axis = 0 if kind == "torch" else 1  # PyTorch's Gemm weights are [out, in]
    assert vm.get(fc2).shape[out_axis] == outputs and vm.get(fc2_b).shape == (outputs,)
    np.testing.assert_array_equal(vm.get(conv), file[conv])  # kept
    for name in (fc1, fc2):  # re-initialised: uniform in +-1/sqrt(fan_in)
        w = vm.get(name)
        fan_in = w.shape[1 - out_axis]
        assert np.abs(w).max() <= 1 / np.sqrt(fan_in) and w.std() > 0.2 / np.sqrt(fan_in)
        assert w.shape != file[name].shape or not np.allclose(w, file[name])
    x, _ = rows(16)
    y = np.random.default_rng(0).integers(0, outputs, 16) if task == "classification" \
        else np.linspace(-1, 1, 16, dtype=np.float32)
    vm.set("x", x)
    vm.set("y", y)
    vm.train_step("train")
    vm.forward("eval")
    assert vm.get("logits").shape == (16, outputs)
    if task == "regression":
        assert np.isfinite(vm.get("regression_sums")).all()
    # head layers train even when a glob freezes them
    g = ONNX.build(params(path, head=1, freeze=["*"]), data(10))
    trainable = {k for k, v in g.variables.items() if v.kind is Kind.PARAMETER and v.trainable}
    assert trainable == {fc2, fc2_b}


def test_a_matmul_layers_bias_is_the_add_after_it(tmp_path: Path) -> None:
    """A dense layer as converters from other frameworks write it, MatMul then Add, on
    flat rows: head resizes the weight [in, out] and the added bias together."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (64, 5)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(5, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["rows", "w"], ["z"]),
             helper.make_node("Add", ["z", "b"], ["scores"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 5])], inits)
    path = tmp_path / "dense.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = ONNX.build(params(path, head=1), data(10))
    assert g.variables["w"].desc.shape == (64, 10)  # type: ignore[union-attr]
    assert g.variables["b"].desc.shape == (10,)  # type: ignore[union-attr]
    assert g.paths[1].nodes[0].op == "MatMul"  # flat rows: no reshape
    prog = compile_graph(g, batch_size=8, optimizer=SGD(lr=0.1))
    assert VM(prog).allocated_bytes == prog.total_bytes


def test_head_beyond_the_weight_layers_and_unmatched_globs_are_errors(tmp_path: Path) -> None:
    path = engine_cnn(tmp_path / "m.onnx")
    with pytest.raises(BuildError, match="has 3 weight layer"):
        ONNX.build(params(path, head=4), data())
    with pytest.raises(BuildError, match=r"'dense\.\*' matches no parameter of m\.onnx; its "
                                         r"parameters: conv\.w, conv\.b, bn\.scale"):
        ONNX.build(params(path, freeze=["dense.*"]), data())
    with pytest.raises(BuildError, match=r"the model's input 'image' is \[N, 1, 8, 8\] \(64 "
                                         r"values a row\); the data set's rows have 784"):
        ONNX.build(params(path), SimpleNamespace(features=784, classes=3, image=(1, 28, 28),
                                                 pixel_scale=None, task="classification"))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_the_programs_are_byte_exact_and_a_step_allocates_nothing(
        source: tuple[str, Path], task: str) -> None:
    _, path = source
    g = ONNX.build(params(path, head=1), data(10, task=task))
    for b in (1, 32, 300):
        prog = compile_graph(g, batch_size=b, optimizer=SGD(lr=0.05))
        assert VM(prog).allocated_bytes == prog.total_bytes
        assert_no_clobber(prog)
    vm = VM(compile_graph(g, batch_size=256, optimizer=SGD(lr=0.05)))
    x, _ = rows(256)
    vm.set("x", x)
    vm.set("y", np.arange(256) % 10 if task == "classification"
           else np.linspace(-1, 1, 256, dtype=np.float32))

    def step() -> None:
        vm.train_step("train")
        vm.forward("eval")

    retained, peak = step_allocations(step, warmup=3, runs=10)
    assert retained < 4096 and peak < 80 * 1024, (retained, peak)


def test_the_model_is_imported_once_per_file_version(tmp_path: Path) -> None:
    from explore.families._onnx import load

    path = engine_cnn(tmp_path / "m.onnx")
    assert load(path) is load(str(path))
    engine_cnn(path, classes=5, seed=1)  # rewritten: a new version
    os.utime(path, ns=(1, 10**18))
    assert load(path).logits_shape == (0, 5)


# -- the schema and a whole run ---------------------------------------------------------


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``explore ...`` in a process of its own, importing this checkout's code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "explore.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


SPACE = """\
dataset: digits
budget: {trials: 3, rounds: 2, memory: 400MB, workers: 2}
sampler: {name: random, seed: 0}
pruner: none
model:
  onnx: models/m.onnx
  freeze: {choice: ["none", "conv.*"]}
  head: 1
training: {lr: {float: [0.01, 0.1], log: true}, batch_size: 32}
keep_models: 2
"""


def test_a_search_over_an_onnx_model_on_digits(tmp_path: Path) -> None:
    """``explore run`` completes its trials with the file's model (the relative path
    resolved next to the YAML, recorded absolute in each trial), and the exported best
    kept model gives the engine's predictions in onnxruntime."""
    import optuna

    import explore
    from explore.datasets import load_digits
    from explore.study import PARAMS_ATTR, RECORD_ATTR

    (tmp_path / "models").mkdir()
    model = engine_cnn(tmp_path / "models" / "m.onnx")
    (tmp_path / "o.yaml").write_text(SPACE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli("run", tmp_path / "o.yaml", "--quiet", cwd=elsewhere)
    assert r.returncode == 0, r.stdout + r.stderr
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{tmp_path / 'o.db'}")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3
    for t in done:
        p = t.user_attrs[RECORD_ATTR].get(PARAMS_ATTR) or t.user_attrs[PARAMS_ATTR]
        assert p["onnx"] == str(model.resolve()) and p["head"] == 1
        assert p["freeze"] in ("none", "conv.*")
        assert t.user_attrs[RECORD_ATTR]["metrics"]["accuracy"] > 0.2
    out = tmp_path / "best.onnx"
    ex = explore_here("export-model", tmp_path / "o.yaml", "--output", out, cwd=elsewhere)
    assert ex.returncode == 0, ex.stderr
    kept = explore.load_model(tmp_path / "o.db", "o")
    test = load_digits().test
    sess = ort.InferenceSession(str(out))
    (x,) = sess.get_inputs()
    assert x.name == "x" and x.type == "tensor(uint8)"
    probs, labels = sess.run(["probabilities", "label"], {"x": kept.features(test.x)})
    np.testing.assert_allclose(probs, kept.predict_proba(test.x), atol=1e-5)
    assert (labels == kept.predict(test.x)).all()


def write(tmp_path: Path, model: str) -> Path:
    f = tmp_path / "s.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 1, rounds: 1, memory: 400MB}\n"
                 f"model:\n{model}")
    return f


@pytest.mark.parametrize(("model", "line", "key", "message"), [
    ("  onnx: missing.onnx\n", 4, "model.onnx", "missing.onnx: no such ONNX file"),
    ("  onnx: junk.onnx\n", 4, "model.onnx", "junk.onnx: not an ONNX model"),
    ("  onnx: folder.onnx\n", 4, "model.onnx", "folder.onnx: a folder, not an ONNX file"),
    ("  onnx: m.onnx\n  depth: {int: [1, 3]}\n", 3, "model",
     "depth: a model of family onnx has its file's architecture"),
    ("  onnx: m.onnx\n  freeze: [dense*]\n", 5, "model.freeze",
     "'dense*' matches no parameter of m.onnx"),
    ("  onnx: m.onnx\n  head: 4\n", 5, "model.head", "m.onnx has 3 weight layer(s)"),
    ("  onnx: m.onnx\n  head: -1\n", 5, "model.head", "greater than or equal to 0"),
    ("  family: cnn\n  blocks: 1\n  onnx: m.onnx\n", 3, "model",
     "onnx is the file of family onnx, not of family cnn"),
    ("  family: onnx\n", 3, "model", "family onnx needs onnx: the path of an .onnx file"),
    ("  onnx: m.onnx\n  freeze: 3\n", 5, "model.freeze",
     "freeze is a list of parameter names (globs)"),
    ("  onnx: m.onnx\n  freeze: {choice: ['conv*', 7]}\n", 5, "model.freeze",
     "not 7"),
    ("  onnx: m.onnx\n  freeze: ['*']\n  head: 0\n", 5, "model.freeze",
     "leaves nothing of m.onnx to train"),
    ("  onnx: m.onnx\n  freeze: {choice: [none, '*']}\n", 5, "model.freeze",
     "freeze '*' with head 0 leaves nothing"),
])
def test_a_bad_model_section_is_refused_with_file_line_and_key(
        tmp_path: Path, model: str, line: int, key: str, message: str) -> None:
    engine_cnn(tmp_path / "m.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf\xff" * 10)
    (tmp_path / "folder.onnx").mkdir()
    f = write(tmp_path, model)
    with pytest.raises(SpaceError) as e:
        bind(load_space(f))  # the schema's errors when read, the file's when bound
    assert f"{f}:{line}: {key}: " in str(e.value) and message in str(e.value), str(e.value)


@pytest.mark.parametrize("model", ["  onnx: missing.onnx\n", "  onnx: junk.onnx\n",
                                   "  onnx: m.onnx\n  depth: {int: [1, 3]}\n",
                                   "  onnx: m.onnx\n  freeze: ['*']\n",
                                   "  onnx: m.onnx\n  freeze: 3\n"])
def test_explore_run_exits_2_before_any_study(tmp_path: Path, model: str) -> None:
    engine_cnn(tmp_path / "m.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf\xff" * 10)
    f = write(tmp_path, model)
    r = explore_here("run", f, "--quiet", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{f.name}:" in r.stdout + r.stderr and "model" in r.stdout + r.stderr
    assert not (tmp_path / "s.db").exists()


def test_a_model_that_does_not_fit_the_data_is_refused_before_any_study(
        tmp_path: Path) -> None:
    engine_cnn(tmp_path / "m.onnx")  # 3 classes; digits has 10
    f = write(tmp_path, "  onnx: m.onnx\n")
    r = cli("run", f, "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "gives 3 scores a row" in r.stdout + r.stderr, r.stdout
    assert not (tmp_path / "s.db").exists()


def test_the_space_records_the_resolved_file_and_its_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From Python, a relative path is the current folder's; the path (absolute),
    freeze and head end the model's parameters, so that each trial's record rebuilds
    the model.  The other families' parameters are as they were."""
    path = engine_cnn(tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    budget = {"trials": 1, "rounds": 1, "memory": "64MB"}
    space = parse_space({"dataset": "digits", "budget": budget,
                         "model": {"onnx": "m.onnx", "freeze": ["conv.*"], "head": 1}})
    p = space.params()
    assert space.model.family == "onnx"
    assert p["onnx"] == str(path.resolve()) and p["freeze"] == ["conv.*"] and p["head"] == 1
    names = list(p)
    assert names[names.index("stage_blocks") + 1:names.index("loss")] == ["onnx", "freeze", "head"]
    plain = parse_space({"dataset": "digits", "budget": budget})
    assert "onnx" not in plain.params()


def test_the_example_space_loads(tmp_path: Path) -> None:
    space = load_space(ROOT / "search_spaces" / "onnx_mnist.yaml")
    assert space.model.family == "onnx" and space.model.head == 1
    assert Path(space.params()["onnx"]) == ROOT / "search_spaces" / "models" / "lenet.onnx"
    g = ONNX.build(space.params() | {"freeze": "conv*"},
                   SimpleNamespace(features=784, classes=10, image=(1, 28, 28),
                                   pixel_scale=1 / 256, task="classification"))
    trainable = {k for k, v in g.variables.items() if v.kind is Kind.PARAMETER and v.trainable}
    assert trainable == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                         "fc3.bias"}
