"""The paper's model trained on the real MNIST reaches at least 95% test accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from engine import VM, Adam, compile_graph
from engine.models import paper_mlp
from engine.runtime.train import evaluate, train_epoch
from explore.datasets import load_mnist


@pytest.mark.slow  # 30 s of training: CI's slow step runs it
def test_paper_mlp_reaches_95_percent_on_mnist() -> None:
    ds = load_mnist()
    vm = VM(compile_graph(paper_mlp(), batch_size=64, optimizer=Adam(lr=1e-3)), seed=0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        train_epoch(vm, ds.train.x, ds.train.y, rng)
    acc = evaluate(vm, ds.test.x, ds.test.y)
    assert acc >= 0.95, f"test accuracy {acc:.4f}"
