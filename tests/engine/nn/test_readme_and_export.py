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


def test_a_computed_mask_exports_as_onnx_comparisons() -> None:
    """Comparisons a forward makes (``x > 0``, ``~``, ``==`` of a slice of a buffer)
    export as ONNX's Greater, Not and Equal, and onnxruntime agrees with the engine."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a dev extra")
    from engine.onnx_io import export_onnx

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: object) -> object:
            h = self.fc(x)
            keep = ~(x > 0.25)
            return h.masked_fill(keep, -1.0).masked_fill(x == 0.5, 9.0)

    g = nn.to_graph(Masked(), inputs={"x": (0, 4)}, loss="mse", target_shape=(0, 4))
    vm = VM(compile_graph(g, batch_size=6), seed=3)
    x = np.random.default_rng(5).random((6, 4)).astype(np.float32)
    x[:, 2] = 0.5  # exactly
    vm.set("x", x)
    vm.forward("eval")
    model = export_onnx(g, ["logits"], vm=vm)
    assert {"Greater", "Not", "Equal"} <= {n.op_type for n in model.graph.node}
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, vm.get("logits"))
    assert (got == 9.0).sum() == 6 and (got == -1.0).any()
