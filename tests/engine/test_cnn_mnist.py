"""A small CNN trained on the real MNIST reaches 98% test accuracy, and the same
network exported to ONNX predicts the same in onnxruntime (about 35 s on 2 cores)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from engine import VM, Adam, compile_graph
from engine.models import mnist_cnn
from engine.onnx_io import export_onnx
from engine.runtime.train import evaluate, train_epoch
from explore.datasets import load_mnist


@pytest.mark.slow  # a whole MNIST training: CI's slow step
def test_a_cnn_learns_mnist_and_exports_to_onnx() -> None:
    ds = load_mnist()
    g = mnist_cnn()
    vm = VM(compile_graph(g, batch_size=128, optimizer=Adam(lr=3e-3)), seed=0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        train_epoch(vm, ds.train.x, ds.train.y, rng)
    acc = evaluate(vm, ds.test.x, ds.test.y)
    assert acc >= 0.98, acc

    model = export_onnx(g, outputs=["eval_logits"], vm=vm)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = ds.test.x[:1000]
    (theirs,) = sess.run(None, {"x": x})
    ours = np.concatenate([_logits(vm, x[s:s + 128]) for s in range(0, len(x), 128)])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours.argmax(1) == theirs.argmax(1)).mean() >= 0.999


def _logits(vm: VM, x: np.ndarray) -> np.ndarray:
    vm.set("x", x)
    vm.set("y", np.zeros(len(x), np.int64))
    vm.forward("eval")
    return vm.get("eval_logits")
