"""Sharing memory changes where values live, never what they are: results are
bit-identical with and without sharing, for every op and for whole models."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, Adam, compile_graph
from tests.engine.compile.test_planner import MODELS
from tests.engine.ops.test_gradients import CASES
from tests.gradcheck import Case, build


def _step(case: Case, sharing: str) -> dict[str, np.ndarray]:
    vm, params = build(case, sharing=sharing)
    vm.forward(0)
    vm.apply_loss(0)
    vm.backward(0)
    loss = vm.program.buffers[vm.program.paths[0].loss].name  # type: ignore[index]
    learned = {vm.program.buffers[ps.buffer].name for ps in vm.program.params
               if ps.grad is not None}
    out = {loss: vm.get(loss)}
    out.update({f"d{p}": vm.grad(p) for p in params if p in learned})
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_op_is_bit_identical_with_and_without_sharing(case: Case) -> None:
    shared, plain = _step(case, "auto"), _step(case, "none")
    assert shared.keys() == plain.keys()
    for k in shared:
        np.testing.assert_array_equal(shared[k], plain[k], err_msg=k)


def _train(name: str, sharing: str, passes: list[str] | None = None) -> dict[str, np.ndarray]:
    g = MODELS[name]()
    opt = None if name == "chain" else (Adam(lr=0.01) if name == "paper_mlp" else SGD(lr=0.05))
    vm = VM(compile_graph(g, batch_size=8, optimizer=opt, sharing=sharing, passes=passes),
            seed=1)
    rng = np.random.default_rng(0)
    feeds = {}
    for b in vm.program.buffers:
        if b.kind == "placeholder":
            shape = b.desc.at_batch(8).shape
            feeds[b.name] = (rng.integers(0, 4, shape) if b.dtype == "int64"
                             else rng.normal(size=shape).astype(b.dtype))
    outs: dict[str, np.ndarray] = {}
    for step in range(3):
        vm.feed(feeds)
        for p in vm.program.paths:
            if p.seed is not None:
                vm.train_step(p.name)
                outs[f"{step}:{p.name}"] = vm.get(vm.program.buffers[p.loss].name)  # type: ignore[index]
            else:
                vm.forward(p.name)
        for b in vm.program.buffers:
            if not b.shared and b.kind in ("generic", "param"):
                outs[f"{step}:{b.name}"] = vm.get(b.name)
    return outs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_train_bit_identically_with_and_without_sharing(name: str) -> None:
    shared, plain = _train(name, "auto"), _train(name, "none")
    assert shared.keys() <= plain.keys() and len(shared) > 3  # sharing hides temporaries
    for k in shared:
        np.testing.assert_array_equal(shared[k], plain[k], err_msg=k)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_graph_optimisations_keep_the_results(name: str) -> None:
    optimised, as_written = _train(name, "auto"), _train(name, "auto", passes=[])
    common = optimised.keys() & as_written.keys()
    assert len(common) > 3
    for k in common:
        np.testing.assert_allclose(optimised[k], as_written[k], rtol=1e-5, atol=1e-6,
                                   err_msg=k)
