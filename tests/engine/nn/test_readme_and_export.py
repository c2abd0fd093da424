"""The README's engine.nn example runs and learns; a traced model's eval path exports
to ONNX and runs in onnxruntime with the engine's outputs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from engine import VM, compile_graph, nn

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_nn_example_runs_and_learns(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
              if "nn.to_graph" in b]
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    acc = float(re.search(r"accuracy ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    assert acc > 0.9 and "conv.weight (8, 1, 3, 3)" in out


def test_eval_path_exports_to_onnx() -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a dev extra")
    from engine.onnx_io import export_onnx

    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding="same"), nn.BatchNorm2d(4), nn.GELU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 3))
    g = nn.to_graph(net, inputs={"x": (0, 2, 4, 4)}, metrics=["accuracy"])
    vm = VM(compile_graph(g, batch_size=5), seed=2)
    x = np.random.default_rng(0).normal(size=(5, 2, 4, 4)).astype(np.float32)
    vm.set("x", x)
    vm.set("y", np.zeros(5, np.int64))
    vm.forward("train")  # moves the running statistics away from 0 and 1
    vm.forward("eval")
    model = export_onnx(g, ["logits"], vm=vm)
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, vm.get("logits"), rtol=1e-5, atol=1e-6)
