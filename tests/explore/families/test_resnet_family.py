"""The resnet family: stages of residual blocks with batch norm, written with engine.nn
like the other built-in families; exact memory, a search on digits, and its exported
model agreeing with the engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import explore
from engine import SGD, VM, compile_graph
from explore.families import BuildError, Shape, get
from tests.allocations import step_allocations
from tests.explore.cli_run import explore_run
from tests.planverify import assert_no_clobber

P = {"depth": 0, "widths": [], "activations": [], "dropouts": [], "init": "he_uniform",
     "blocks": 2, "channels": [4, 8], "stride": 2, "stage_blocks": 2}


def test_stages_downsample_and_project_where_the_shape_changes() -> None:
    g = get("resnet").build(P, Shape(64, 10, image=(1, 8, 8)))
    names = set(g.variables)
    assert "stem.0.weight" in names and "stages.0.1.conv2.weight" in names
    assert "stages.0.0.shortcut.0.weight" not in names  # 4 -> 4, stride 1: identity
    assert "stages.1.0.shortcut.0.weight" in names  # 4 -> 8, stride 2: projected
    assert "stages.1.1.shortcut.0.weight" not in names
    convs = [n for n in g.paths[1].nodes if n.op == "Conv"]
    # stem; stage 0: two blocks; stage 1: conv1, conv2, shortcut, then a block
    assert [n.attrs.get("strides", (1, 1))[0] for n in convs] == [1, 1, 1, 1, 1, 2, 1, 2, 1, 1]
    with pytest.raises(BuildError, match="needs images"):
        get("resnet").build(P, Shape(64, 10))


def test_a_resnet_is_planned_exactly_and_its_step_allocates_nothing() -> None:
    g = get("resnet").build(P, Shape(64, 10, image=(1, 8, 8), pixel_scale=1 / 16))
    for b in (1, 32):
        prog = compile_graph(g, batch_size=b, optimizer=SGD(lr=0.05, momentum=0.9))
        assert VM(prog).allocated_bytes == prog.total_bytes
        assert_no_clobber(prog)
    vm = VM(compile_graph(g, batch_size=64, optimizer=SGD(lr=0.05)))
    rng = np.random.default_rng(0)
    vm.set("x", rng.integers(0, 17, (64, 64)).astype(np.uint8))
    vm.set("y", rng.integers(0, 10, 64))

    def step() -> None:
        vm.train_step("train")
        vm.forward("eval")

    retained, peak = step_allocations(step, warmup=3, runs=10)
    # numpy's iteration buffer for three float32 operands (the convolution gradients'
    # strided adds), whatever the batch, and a few small Python objects beside it
    assert retained < 4096 and peak < 3 * 8192 * 4 + 8192, (retained, peak)


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_a_resnet_search_on_digits_and_its_exported_model(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime comes with the dev extra")
    from explore.datasets import load_digits

    f = tmp_path / "r.yaml"
    f.write_text("dataset: digits\nbudget: {trials: 3, rounds: 2, memory: 500MB}\n"
                 "sampler: {name: random, seed: 0}\npruner: none\n"
                 "model: {family: resnet, blocks: {int: [1, 2]}, channels: 8, stride: 2,\n"
                 "        stage_blocks: 1, depth: 0}\n"
                 "training: {lr: 0.01, batch_size: 32}\n")
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    model = explore.load_model(tmp_path / "r.db", "r")
    test = load_digits().test
    sess = ort.InferenceSession(model.to_onnx().SerializeToString())
    probs, labels = sess.run(["probabilities", "label"], {"x": model.features(test.x)})
    np.testing.assert_allclose(probs, model.predict_proba(test.x), atol=1e-5)
    assert (labels == model.predict(test.x)).all()
    assert (labels == test.y).mean() > 0.5
