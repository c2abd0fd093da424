"""Golden outputs ("process replay", as tinygrad keeps it): the bytecode, the memory plan
(every zone's bytes, every buffer's offset) and the loss of the first training steps of a
fixed set of models are stored in ``tests/golden/``; a change that is meant to keep
behaviour (a refactor, a move) must leave them unchanged.

A change that means to alter them (a better plan, a new fusion) regenerates the files
with ``GOLDEN_UPDATE=1 python -m pytest tests/test_golden.py`` and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import SGD, VM, Adam, CalcGraph, compile_graph
from engine.models import mnist_cnn, paper_mlp

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
STEPS = 3


def _paper_mlp() -> tuple[CalcGraph, Any, int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.random((64, 784), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    return paper_mlp(), Adam(lr=1e-3), 64, {"x": x, "y": y}


def _mnist_cnn() -> tuple[CalcGraph, Any, int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    x = rng.random((16, 784), dtype=np.float32)
    y = rng.integers(0, 10, 16)
    return mnist_cnn(), SGD(lr=0.05, momentum=0.9), 16, {"x": x, "y": y}


def _stack_of_4() -> tuple[CalcGraph, Any, int, dict[str, np.ndarray]]:
    from engine.compile.stack import stack_graphs, stack_optimizers
    from engine.models import paper_mlp as mlp

    graphs = [mlp((20, 16, 8, 4), activation="Tanh") for _ in range(4)]
    opt = stack_optimizers([SGD(lr=0.01 * (k + 1), momentum=0.9) for k in range(4)])
    rng = np.random.default_rng(2)
    x = rng.random((32, 20), dtype=np.float32)
    y = rng.integers(0, 4, 32)
    return stack_graphs(graphs), opt, 32, {"x": x, "y": y}


def _onnx_squeezenet() -> tuple[CalcGraph, Any, int, dict[str, np.ndarray]]:
    onnx = pytest.importorskip("onnx", reason="onnx is a core dependency")
    from engine.onnx_io import import_onnx
    from engine.onnx_io.light import data_input, light_models, randomized

    m = randomized(onnx.load(light_models()["squeezenet"]))
    inp = data_input(m)
    rng = np.random.default_rng(3)
    x = rng.random((2, 3, 224, 224), dtype=np.float32)
    feed = {inp.name: x, "labels": np.array([3, 7])}
    return import_onnx(m, loss="cross_entropy"), SGD(lr=1e-3), 2, feed


MODELS: dict[str, Callable[[], tuple[CalcGraph, Any, int, dict[str, np.ndarray]]]] = {
    "paper_mlp": _paper_mlp,
    "mnist_cnn": _mnist_cnn,
    "stack_of_4": _stack_of_4,
    "onnx_squeezenet": _onnx_squeezenet,
}


def _digest_arrays(o: Any) -> Any:
    """Imported weights are whole arrays: keep their digest, not their values."""
    if isinstance(o, dict):
        return {k: _digest_arrays(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        if len(o) > 64 and all(isinstance(v, float | int) for v in o):
            data = np.asarray(o, dtype=np.float64).tobytes()
            return {"array_sha256": hashlib.sha256(data).hexdigest(), "len": len(o)}
        return [_digest_arrays(v) for v in o]
    return o


def replay(name: str) -> dict[str, Any]:
    graph, optimizer, batch, feed = MODELS[name]()
    prog = compile_graph(graph, batch_size=batch, optimizer=optimizer)
    program = _digest_arrays(json.loads(prog.to_json()))
    vm = VM(prog, seed=0)
    vm.feed(feed)
    path = prog.paths[0].name
    losses = []
    for _ in range(STEPS):
        vm.train_step(path)
        losses.append(float(np.sum(vm.get(prog.buffers[prog.paths[0].loss].name))))
    return {
        "zone_bytes": prog.zone_bytes,
        "offsets": {b.name: [b.zone, b.offset] for b in prog.buffers},
        "bytecode": [[i.op, list(i.ins), list(i.outs), i.workspace] for i in prog.instrs],
        "program": program,
        "losses": losses,
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_golden_outputs_are_unchanged(name: str) -> None:
    got = json.loads(json.dumps(replay(name)))
    file = GOLDEN / f"{name}.json"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        file.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(file.read_text())
    assert got["zone_bytes"] == want["zone_bytes"]
    assert got["offsets"] == want["offsets"]
    assert got["bytecode"] == want["bytecode"]
    assert got["program"] == want["program"]
    # The same kernels in the same order give the same floats; a little room for a BLAS
    # that splits a product differently on another machine's core count.
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
